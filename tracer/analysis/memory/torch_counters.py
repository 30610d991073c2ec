"""memtrace's curves against torch's own counters, read in the same process at vLLM's phase edges (pure).

The vLLM plugin reads torch's counters at the start and end of every phase (``facts
["memtrace.phase_memory"]``: reserved and allocated now, and their peaks since the last reset) and
records every reset of the peaks (``facts["memtrace.peak_resets_us"]``). The same figures follow from
memtrace's own curves, built from the allocator's events only:

- **reserved now** = the reserved curve at the reading;
- **reserved peak** = the reserved curve's maximum between the last reset before the reading (or the
  start of the recording) and the reading;
- **allocated now** = PyTorch allocated counted in blocks, as torch counts it (``quantities.ALLOCATED_BLOCKS``,
  ``blocks.block_curve``), at the reading;
- **allocated peak - allocated now**: the same window on that blocks' curve.

Equal figures say the recording lost nothing and the curves mean what torch means; a difference names the
reading where they part.
"""

from __future__ import annotations

from dataclasses import dataclass

from memtrace import facts as F
from memtrace.analysis.capacity.extensible import torch_allocated_curve
from memtrace.analysis.memory.curves import Curves
from memtrace.analysis.memory.quantities import window_max
from memtrace.model import Trace


@dataclass(frozen=True)
class CounterCheck:
    """One reading of torch's counters beside memtrace's figures for the same moment (bytes)."""

    phase: str
    edge: str  # "start" or "end"
    time_us: int
    since_us: int  # the window's start: the last peak reset, or the recording's start
    torch_reserved_bytes: int
    memtrace_reserved_bytes: int
    torch_reserved_peak_bytes: int | None
    memtrace_reserved_peak_bytes: int
    torch_transient_bytes: int | None  # allocated peak - allocated now, torch's
    memtrace_transient_bytes: int
    torch_allocated_bytes: int | None = None  # torch.cuda.memory_allocated()
    memtrace_allocated_bytes: int | None = None  # quantities.ALLOCATED_BLOCKS at the reading (blocks.block_curve)

    @property
    def equal(self) -> bool:
        return (
            self.torch_reserved_bytes == self.memtrace_reserved_bytes
            and self.torch_allocated_bytes in (None, self.memtrace_allocated_bytes)
            and self.torch_reserved_peak_bytes in (None, self.memtrace_reserved_peak_bytes)
            and self.torch_transient_bytes in (None, self.memtrace_transient_bytes)
        )


def counter_checks(trace: Trace, curves: Curves) -> list[CounterCheck]:
    """Every phase-edge reading that carries torch's counters, checked (empty when none was recorded)."""
    readings = [r for r in trace.facts.get(F.PHASE_MEMORY) or [] if isinstance(r, dict) and "time_us" in r]
    if not readings or not len(trace.events):
        return []
    resets = sorted(int(t) for t in trace.facts.get(F.PEAK_RESETS_US) or [])
    alloc = torch_allocated_curve(trace, curves)
    start = int(curves.reserved.time_us[0])
    out = []
    for r in readings:
        t = int(r["time_us"])
        since = max([x for x in resets if x <= t] + [start])
        peak = r.get("allocated_peak_bytes")
        now = r.get("allocated_bytes")
        out.append(
            CounterCheck(
                phase=str(r.get("phase", "")),
                edge=str(r.get("edge", "")),
                time_us=t,
                since_us=since,
                torch_reserved_bytes=int(r.get("reserved_bytes", 0)),
                memtrace_reserved_bytes=curves.reserved.at(t),
                torch_reserved_peak_bytes=r.get("reserved_peak_bytes"),
                memtrace_reserved_peak_bytes=window_max(curves.reserved, since, t),
                torch_transient_bytes=(peak - now) if isinstance(peak, int) and isinstance(now, int) else None,
                memtrace_transient_bytes=window_max(alloc, since, t) - alloc.at(t),
                torch_allocated_bytes=now if isinstance(now, int) else None,
                memtrace_allocated_bytes=alloc.at(t),
            )
        )
    return out
