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

from memtrace.analysis.holders.frames import per_trace
from memtrace.analysis.memory.curves import Curves
from memtrace.analysis.memory.quantities import samples_peak, window_max, window_peak
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


@per_trace
def recording_span(trace: Trace) -> tuple[int, int]:
    """(first, last) microsecond the trace knows about: recording bounds, events, samples, phases (once a trace)."""
    rec = trace.recording
    starts = [rec.start_us] if rec.start_us is not None else []
    ends = [rec.end_us] if rec.end_us is not None else []
    for a in (trace.events["time_us"], trace.samples["time_us"]):
        if len(a):
            starts.append(int(a.min()))
            ends.append(int(a.max()))
    starts += [p.start_us for p in trace.phases]
    ends += [p.end_us if p.end_us is not None else p.start_us for p in trace.phases]
    return (min(starts), max(ends or starts)) if starts else (0, 0)  # no ends: starts is the recording's start alone


def phase_chain(trace: Trace, index: int) -> list[int]:
    """Phase ``index`` and the phases enclosing it, innermost first."""
    out: list[int] = []
    i: int | None = index
    while i is not None and 0 <= i < len(trace.phases) and i not in out:
        out.append(i)
        i = trace.phases[i].parent
    return out


def phase_depth(trace: Trace, index: int) -> int:
    """Nesting depth of phase ``index`` (0 at top level)."""
    return len(phase_chain(trace, index)) - 1


def phase_path(trace: Trace, index: int) -> str:
    """The names from the outermost enclosing phase down to phase ``index``, joined by ``/``."""
    return "/".join(trace.phases[i].name for i in reversed(phase_chain(trace, index)))


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


def phase_stats(trace: Trace, curves: Curves) -> list[PhaseStats]:
    """Statistics of every phase, in the order of ``trace.phases`` (``curves``: the run's, ``AnalysedRank.curves``)."""
    _, end_of_trace = recording_span(trace)
    out = []
    for i, p in enumerate(trace.phases):
        end = p.end_us if p.end_us is not None else max(end_of_trace, p.start_us)
        peak_res, peak_res_us = window_peak(curves.reserved, p.start_us, end)
        out.append(
            PhaseStats(
                index=i,
                name=p.name,
                path=phase_path(trace, i),
                depth=phase_depth(trace, i),
                start_us=p.start_us,
                end_us=end,
                ended=p.end_us is not None,
                start_allocated_bytes=curves.allocated.at(p.start_us, first_before=True),
                end_allocated_bytes=curves.allocated.at(end, first_before=True),
                peak_allocated_bytes=window_max(curves.allocated, p.start_us, end),
                start_reserved_bytes=curves.reserved.at(p.start_us, first_before=True),
                end_reserved_bytes=curves.reserved.at(end, first_before=True),
                peak_reserved_bytes=peak_res,
                peak_reserved_us=peak_res_us,
                peak_device_used_bytes=samples_peak(curves.device_used, p.start_us, end),
            )
        )
    return out
