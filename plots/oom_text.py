"""The words for an OOM, shared by every renderer: what was asked for, what was free, the limit.

One phrasing for the report, its serving window, fits, diff, the issue bundle, the view and the timeline, from
``analysis.oom.Oom``. Small sizes read as torch's own message does ("32.00 MiB", not "0.03 GiB"); with
``exact`` each figure is followed by its bytes, so it can be checked against torch's message ("22.00 MiB
(23,068,672 B)"). The allocator's limit is named only when it was below the device (a per-process memory
fraction, "12.25 GiB allowed" in torch's message).
"""

from __future__ import annotations

from memtrace.analysis.memory import quantities as Q
from memtrace.analysis.memory.oom import Oom
from memtrace.units import format_size


def where(o: Oom) -> str:
    return f"in {o.phase_path}" if o.phase_path else "outside any phase"


def _size(n: int, exact: bool) -> str:
    return f"{format_size(n)} ({n:,} B)" if exact else format_size(n)


def requested(o: Oom, exact: bool = False) -> str:
    """``requested 22.00 MiB``: the failed request, as torch's "Tried to allocate" says it."""
    return f"requested {_size(o.requested_bytes, exact)}"


def details(o: Oom, device_total_bytes: int | None = None, sep: str = ", ", exact: bool = False) -> str:
    """``requested 32.00 MiB, device free 5.56 MiB`` (+ ``allocator limit 15.33 GiB`` when limited); with
    ``exact``, each figure's bytes after it."""
    free = (
        f"{Q.DEVICE_FREE.label} {_size(o.free_bytes, exact)}"
        if o.free_bytes is not None
        else "free memory not recorded"
    )
    parts = [requested(o, exact), free]
    limit = o.limit_bytes(device_total_bytes)
    if limit is not None:
        parts.append(f"allocator limit {_size(limit, exact)}")
    if o.count > 1:
        parts.append(f"{o.count} OOMs recorded, the first shown")
    return sep.join(parts)
