"""Per-phase statistics: what each phase started with, ended with, peaked at and left behind.

A phase is a span ``[start_us, end_us)``; a phase that never ended (the process died inside it)
runs to the end of the recording. Phases nest through ``Phase.parent``; a phase's *path* joins
the names from the outermost to it with ``/`` ("compile_or_warm_up_model/capture_model").

Values at the start and end are the curve values in force at those instants (``Curve.at``); the
peak is the maximum of the curve over the phase, the value in force at its start included. Pure
functions over a Trace (and, to share work, its precomputed Curves).
"""

from __future__ import annotations

from dataclasses import dataclass

from memtrace.analysis.memory.curves import Curve, Curves
from memtrace.analysis.memory.quantities import samples_peak, window_peak
from memtrace.model import Phase, Trace


@dataclass(frozen=True)
class PhaseStats:
    """Memory figures of one phase. Bytes are integers; times are Unix-epoch microseconds."""

    index: int  # the phase's index in trace.phases
    name: str
    path: str
    depth: int  # 0 for a top-level phase
    start_us: int
    end_us: int  # the recording's end for a phase that never ended
    ended: bool  # False when the process stopped inside the phase
    start_allocated_bytes: int
    end_allocated_bytes: int
    peak_allocated_bytes: int
    start_reserved_bytes: int
    end_reserved_bytes: int
    peak_reserved_bytes: int
    peak_reserved_us: int
    peak_device_used_bytes: int | None  # None without NVML samples inside the phase

    @property
    def delta_reserved_bytes(self) -> int:
        return self.end_reserved_bytes - self.start_reserved_bytes

    @property
    def delta_allocated_bytes(self) -> int:
        return self.end_allocated_bytes - self.start_allocated_bytes


def _time_bounds(trace: Trace) -> list[tuple[int, int]]:
    """(min, max) time of the events and of the samples, for those that are not empty."""
    arrays = (trace.events["time_us"], trace.samples["time_us"])
    return [(int(a.min()), int(a.max())) for a in arrays if len(a)]


def recording_span(trace: Trace) -> tuple[int, int]:
    """(first, last) microsecond the trace knows about: recording bounds, events, samples, phases."""
    starts, ends = [], []
    rec = trace.recording
    for v in (rec.start_us,):
        if v is not None:
            starts.append(v)
    if rec.end_us is not None:
        ends.append(rec.end_us)
    for lo, hi in _time_bounds(trace):
        starts.append(lo)
        ends.append(hi)
    for p in trace.phases:
        starts.append(p.start_us)
        ends.append(p.end_us if p.end_us is not None else p.start_us)
    if not starts:
        return 0, 0
    return min(starts), max(ends) if ends else min(starts)


def phase_depth(trace: Trace, index: int) -> int:
    """Nesting depth of phase ``index`` (0 at top level)."""
    depth, seen = 0, set()
    parent = trace.phases[index].parent
    while parent is not None and 0 <= parent < len(trace.phases) and parent not in seen:
        seen.add(parent)
        depth += 1
        parent = trace.phases[parent].parent
    return depth


def phase_path(trace: Trace, index: int) -> str:
    """The names from the outermost enclosing phase down to phase ``index``, joined by ``/``."""
    names, seen = [], set()
    i: int | None = index
    while i is not None and 0 <= i < len(trace.phases) and i not in seen:
        seen.add(i)
        names.append(trace.phases[i].name)
        i = trace.phases[i].parent
    return "/".join(reversed(names))


def phase_index_at(trace: Trace, t_us: int) -> int | None:
    """Index of the innermost phase in force at ``t_us`` (start <= t < end), or None."""
    end_of_trace = None  # read only for a phase that never ended: it scans every event
    best, best_key = None, None
    for i, p in enumerate(trace.phases):
        if p.end_us is None and end_of_trace is None:
            end_of_trace = recording_span(trace)[1]
        end = p.end_us if p.end_us is not None else max(end_of_trace, p.start_us) + 1
        if p.start_us <= t_us < end:
            key = (phase_depth(trace, i), p.start_us, i)
            if best_key is None or key > best_key:
                best, best_key = i, key
    return best


def phase_at(trace: Trace, t_us: int) -> Phase | None:
    """The innermost phase in force at ``t_us``, or None outside every phase."""
    i = phase_index_at(trace, t_us)
    return trace.phases[i] if i is not None else None


def path_at(trace: Trace, t_us: int) -> str:
    """The phase path in force at ``t_us``; "" outside every phase."""
    i = phase_index_at(trace, t_us)
    return phase_path(trace, i) if i is not None else ""


def value_at(curve: Curve, t_us: int) -> int:
    """``curve.at(t_us)``, except that before the curve's first point its first value holds: an event
    curve's first point is the baseline, the state before recording began."""
    if len(curve) == 0:
        return 0
    if t_us < int(curve.time_us[0]):
        return int(curve.bytes[0])
    return curve.at(t_us)


def phase_stats(trace: Trace, curves: Curves) -> list[PhaseStats]:
    """Statistics of every phase, in the order of ``trace.phases`` (``curves``: the run's, ``AnalysedRank.curves``)."""
    _, end_of_trace = recording_span(trace)
    out = []
    for i, p in enumerate(trace.phases):
        end = p.end_us if p.end_us is not None else max(end_of_trace, p.start_us)
        peak_res, peak_res_us = window_peak(curves.reserved, p.start_us, end)
        peak_alloc, _ = window_peak(curves.allocated, p.start_us, end)
        out.append(
            PhaseStats(
                index=i,
                name=p.name,
                path=phase_path(trace, i),
                depth=phase_depth(trace, i),
                start_us=p.start_us,
                end_us=end,
                ended=p.end_us is not None,
                start_allocated_bytes=value_at(curves.allocated, p.start_us),
                end_allocated_bytes=value_at(curves.allocated, end),
                peak_allocated_bytes=peak_alloc,
                start_reserved_bytes=value_at(curves.reserved, p.start_us),
                end_reserved_bytes=value_at(curves.reserved, end),
                peak_reserved_bytes=peak_res,
                peak_reserved_us=peak_res_us,
                peak_device_used_bytes=samples_peak(curves.device_used, p.start_us, end),
            )
        )
    return out
