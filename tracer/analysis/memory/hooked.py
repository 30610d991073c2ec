"""What the hooked functions (FlashInfer's workspace allocators by default) handed out, counted once.

A hooked call may run inside another (``B12xMoEWrapper._allocate_buffers`` calls
``allocate_sm120_moe_workspace``, which calls the static and dynamic allocators): per-function totals
(``summary.hook_totals``) count a nested call's bytes under each function it ran in, so they must not be
added up. :func:`outermost` counts only the calls no other hooked call encloses: the bytes the hooks
returned in all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memtrace.model import HookCall


@dataclass(frozen=True)
class Outermost:
    """The hooked calls no other hooked call encloses, added up."""

    calls: int
    returned_bytes: int  # distinct storages they returned, summed (nested calls' bytes included once)


def outermost(calls: Sequence[HookCall]) -> Outermost | None:
    """The outermost hooked calls of a trace added up (see the module docstring); None without hook calls."""
    if not calls:
        return None
    top = [c for c in calls if c.parent is None]
    return Outermost(
        calls=len(top),
        returned_bytes=sum(c.returned_bytes or 0 for c in top),
    )
