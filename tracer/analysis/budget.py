"""Is a trace's peak within a memory budget? The pure check behind the pytest plugin's marker.

The peak is taken on one curve: ``reserved`` (PyTorch's segments, the default: what the process
holds on the card), ``allocated`` (bytes live in tensors) or ``device`` (NVML device-used: the
whole card, CUDA context and other processes included; needs NVML samples). The result names the
phase of the peak and the stacks holding the most memory there.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from ..model import Frame, Trace
from .curves import all_curves
from .flame import peak_event_index
from .live import holders_by_stack, lifetimes, meaningful_frame
from .phases import path_at

CURVES = ("reserved", "allocated", "device")


@dataclass(frozen=True)
class BudgetHolder:
    """Bytes live at the peak from one allocating stack."""

    bytes: int
    count: int
    frame: Frame | None  # the innermost frame worth showing (outside torch and memtrace)


@dataclass(frozen=True)
class BudgetCheck:
    """The verdict of :func:`check_budget`."""

    budget_bytes: int
    curve: str
    peak_bytes: int
    peak_us: int
    phase: str  # phase path in force at the peak ("" outside every phase)
    holders: list[BudgetHolder]

    @property
    def over(self) -> bool:
        return self.peak_bytes > self.budget_bytes

    @property
    def excess_bytes(self) -> int:
        return self.peak_bytes - self.budget_bytes


def check_budget(trace: Trace, budget_bytes: int, *, curve: str = "reserved", top: int = 5) -> BudgetCheck:
    """Compare the peak of ``curve`` in ``trace`` with ``budget_bytes``.

    Args:
        trace: the recorded trace.
        budget_bytes: the largest peak allowed.
        curve: "reserved" (default), "allocated" or "device" (NVML).
        top: how many holders at the peak to report.
    Raises:
        UsageError: an unknown curve, or "device" without NVML samples.
    """
    if curve not in CURVES:
        raise UsageError(f"unknown curve {curve!r} for a memory budget; use one of {', '.join(CURVES)}")
    curves = all_curves(trace)
    c = {"reserved": curves.reserved, "allocated": curves.allocated, "device": curves.device_used}[curve]
    if curve == "device" and len(c) == 0:
        raise UsageError("the trace holds no NVML samples, so no device-level peak; budget the 'reserved' curve")
    if len(c) == 0:
        return BudgetCheck(budget_bytes, curve, 0, trace.recording.start_us or 0, "", [])
    i = c.peak_index
    peak_us = int(c.time_us[i])
    if curve == "device":
        event_index = None
    elif curve == "allocated":
        event_index = i - 1  # curve index i is the state after event i - 1
    else:
        event_index = peak_event_index(curves.allocated, curves.reserved)
    lt = lifetimes(trace)
    if event_index is None:
        hs = holders_by_stack(trace, peak_us, top=top, lt=lt)
    else:
        hs = holders_by_stack(trace, top=top, event_index=event_index, lt=lt)
    holders = [BudgetHolder(h.bytes, h.count, meaningful_frame(trace.stack_frames(h.stack))) for h in hs]
    return BudgetCheck(budget_bytes, curve, c.peak_bytes, peak_us, path_at(trace, peak_us), holders)
