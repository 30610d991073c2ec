"""The summary of one trace: its peak, when it crossed the target, per-phase figures, who held the peak.

``summarize(trace, target_bytes)`` is what ``memtrace report`` prints and what other tools (the
plugin's end-of-start-up line, ``memtrace run``) reuse. Plain data in, plain data out: bytes and
microseconds as integers, frames resolved so a renderer never needs the Trace.

Definitions:

- **peak**: the global maximum of the reserved curve (the first time it is reached), with the
  allocated bytes at that same instant and the innermost phase in force. The peaks of the
  allocated curve and of NVML device-used are reported beside it.
- **crossing**: the first time a curve (reserved; NVML device-used when sampled) goes above the
  target. Its *excursion* lasts until the curve drops back to or below the target;
  ``value_bytes`` is the excursion's maximum, ``overshoot_bytes`` = value - target.
- **target**: the explicit argument, else ``facts["target_bytes"]``, else
  ``ceil(facts["gpu_memory_utilization"] * process.device_total_bytes)`` (vLLM's requested memory).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model import (
    FACT_ENV,
    FACT_OOM,
    FACT_TARGET_BYTES,
    FACT_UTIL,
    FACT_VLLM_AVAILABLE_KV_BYTES,
    Frame,
    HookCall,
    Note,
    Process,
    Recording,
    Trace,
)
from .curves import Baseline, Curve, Curves, all_curves
from .live import holders_by_stack, lifetimes, meaningful_frame
from .phases import PhaseStats, path_at, phase_path, phase_stats, recording_span, window_peak
from .reconcile import KvReconciliation, reconcile_kv

#: Phase names (substrings) of vLLM's memory profiling, most specific first, for the reconciliation.
PROFILING_PHASES = ("determine_available_memory", "profile_run", "profile")


@dataclass(frozen=True)
class Peak:
    """The global peak of reserved memory (first reached at ``time_us``) and what it held.

    Reserved stays at its peak until a segment is released, and the tensor a new segment was made
    for is handed out by the *next* event; so ``allocated_bytes`` and the holders are taken at the
    fullest moment (most allocated bytes, first reached) while reserved stays at the peak:
    right after event ``event_index``, at ``state_us``.
    """

    time_us: int
    reserved_bytes: int
    allocated_bytes: int
    phase_path: str
    event_index: int  # the state shown: right after this event (-1: the baseline itself)
    non_torch_bytes: int | None = None  # NVML used - reserved at the last steady sample at or before it
    state_us: int = 0  # when the state shown was reached (see below)


@dataclass(frozen=True)
class PeakPoint:
    """The maximum of one curve."""

    curve: str  # "allocated", "device_used"
    time_us: int
    bytes: int
    phase_path: str


@dataclass(frozen=True)
class Crossing:
    """The first excursion of a curve above the target."""

    curve: str  # "reserved" or "device_used"
    time_us: int
    phase_path: str
    value_bytes: int  # maximum during the excursion
    value_us: int  # when that maximum was reached
    overshoot_bytes: int  # value_bytes - target
    duration_us: int  # until the curve dropped back to or below the target (or the recording ended)
    ended_above: bool  # the recording ended while still above the target
    excursions: int  # how many separate times the curve went above the target


@dataclass(frozen=True)
class HolderLine:
    """Live bytes at the peak held by one allocating stack."""

    stack: int
    frame: Frame | None  # the innermost user-meaningful frame
    frames: list[Frame]
    bytes: int
    count: int
    share: float


@dataclass(frozen=True)
class Reconciliation:
    """memtrace's non-KV memory next to vLLM's available-KV figure (a simple, labelled estimate)."""

    target_bytes: int
    vllm_available_kv_bytes: int
    phase_path: str  # the profiling phase whose peak was used ("" when none was found)
    peak_reserved_bytes: int  # peak reserved during that phase (or before the KV cache, see note)
    non_torch_bytes: int | None  # NVML used - reserved at that peak, when sampled
    note: str

    @property
    def memtrace_non_kv_bytes(self) -> int:
        return self.peak_reserved_bytes + (self.non_torch_bytes or 0)

    @property
    def memtrace_available_kv_bytes(self) -> int:
        return self.target_bytes - self.memtrace_non_kv_bytes

    @property
    def difference_bytes(self) -> int:
        """memtrace's implied available KV minus vLLM's (positive: vLLM was more conservative)."""
        return self.memtrace_available_kv_bytes - self.vllm_available_kv_bytes


@dataclass
class Summary:
    """Everything ``memtrace report`` shows for one trace."""

    label: str
    process: Process
    recording: Recording
    env: dict[str, Any]
    start_us: int
    end_us: int
    n_events: int
    n_samples: int
    baseline: Baseline
    peak: Peak
    peak_allocated: PeakPoint
    peak_device_used: PeakPoint | None
    target_bytes: int | None
    target_source: str  # "argument", "facts", "utilization", ""
    crossings: list[Crossing]
    phases: list[PhaseStats]
    holders: list[HolderLine]
    hook_calls: list[HookCall]
    notes: list[Note]
    warnings: list[str] = field(default_factory=list)
    reconciliation: Reconciliation | None = None  # the simple estimate (always, when vLLM's figure is known)
    kv: KvReconciliation | None = None  # vLLM's own formula on memtrace's curves (analysis.reconcile)
    oom: dict[str, Any] | None = None
    path: str = ""

    @property
    def truncated(self) -> bool:
        return self.recording.truncated


def resolve_target(trace: Trace, target_bytes: int | None) -> tuple[int | None, str]:
    """The target in bytes and where it came from."""
    if target_bytes is not None:
        return int(target_bytes), "argument"
    if trace.facts.get(FACT_TARGET_BYTES) is not None:
        return int(trace.facts[FACT_TARGET_BYTES]), "facts"
    util, total = trace.facts.get(FACT_UTIL), trace.process.device_total_bytes
    if util is not None and total:
        return math.ceil(float(util) * int(total)), "utilization"
    return None, ""


def crossing(trace: Trace, curve: Curve, target: int, name: str) -> Crossing | None:
    """The first excursion of ``curve`` above ``target``, or None if it never goes above."""
    above = curve.bytes > target
    if not above.any():
        return None
    i = int(np.argmax(above))
    below_after = np.flatnonzero(~above[i:])
    j = i + int(below_after[0]) if len(below_after) else len(curve)
    k = i + int(np.argmax(curve.bytes[i:j]))
    t = int(curve.time_us[i])
    end = int(curve.time_us[j]) if j < len(curve) else max(recording_span(trace)[1], t)
    rises = int(above[0]) + int(np.count_nonzero(above[1:] & ~above[:-1]))
    return Crossing(
        curve=name,
        time_us=t,
        phase_path=path_at(trace, t),
        value_bytes=int(curve.bytes[k]),
        value_us=int(curve.time_us[k]),
        overshoot_bytes=int(curve.bytes[k]) - target,
        duration_us=end - t,
        ended_above=j >= len(curve),
        excursions=rises,
    )


def _profiling_window(trace: Trace) -> tuple[str, int, int] | None:
    """(label, start, end) spanning every phase whose name contains a PROFILING_PHASES word."""
    hits = [i for i, p in enumerate(trace.phases) if any(k in p.name for k in PROFILING_PHASES)]
    if not hits:
        return None
    end_of_trace = recording_span(trace)[1]
    start = min(trace.phases[i].start_us for i in hits)
    end = max(trace.phases[i].end_us if trace.phases[i].end_us is not None else end_of_trace for i in hits)
    tops = [i for i in hits if not any(trace.phases[i].parent == j for j in hits)]
    return " + ".join(dict.fromkeys(phase_path(trace, i) for i in tops)), start, end


def reconcile(trace: Trace, curves: Curves, target: int | None) -> Reconciliation | None:
    """Compare vLLM's available-KV figure with target - (peak reserved while profiling + non-torch)."""
    kv = trace.facts.get(FACT_VLLM_AVAILABLE_KV_BYTES)
    if kv is None or target is None:
        return None
    window = _profiling_window(trace)
    if window is None:
        path, start, end = "", *recording_span(trace)
        note = "no profiling phase recorded: used the peak reserved over the whole recording"
    else:
        path, start, end = window
        note = "peak reserved while profiling + non-torch memory (NVML used - reserved) at that peak"
    peak_bytes, peak_us = window_peak(curves.reserved, start, end)
    non_torch = _non_torch_at(curves, peak_us)
    if non_torch is None:
        note += "; no NVML samples, so non-torch memory is not counted"
    return Reconciliation(int(target), int(kv), path, peak_bytes, non_torch, note)


def _non_torch_at(curves: Curves, t_us: int) -> int | None:
    """Non-PyTorch bytes at ``t_us`` from the last *steady* NVML sample (see landmarks.steady_non_torch:
    while memory moves fast, used - reserved is off by whole allocations); None without samples."""
    if not curves.has_device:
        return None
    from .landmarks import steady_non_torch

    steady = steady_non_torch(curves)
    return int(steady.at(max(t_us, int(steady.time_us[0])))) if len(steady) else None


def _warnings(trace: Trace, curves: Curves) -> list[str]:
    out = []
    rec = trace.recording
    if rec.truncated:
        lost = f" (at least {rec.lost_events_min:,} events lost)" if rec.lost_events_min else ""
        out.append(
            f"the allocator history was truncated{lost}: curves before the loss are reconstructed, "
            "not recorded; raise max_entries or drain more often"
        )
    if not curves.baseline.consistent:
        out.append(
            "the recorded events do not add up to the final allocator state: some events are missing; "
            "figures before the gap may be off"
        )
    for p in trace.phases:
        if p.end_us is None:
            out.append(f"phase '{p.name}' never ended: the process stopped inside it")
    return out


def summarize(trace: Trace, target_bytes: int | None = None, *, top: int = 10, curves: Curves | None = None) -> Summary:
    """Summarize one trace (see the module docstring for the definitions).

    Args:
        trace: the trace.
        target_bytes: the line not to cross; defaults to the trace's facts.
        top: how many holders at the peak to keep.
        curves: precomputed ``all_curves(trace)``.
    """
    curves = curves or all_curves(trace)
    start_us, end_us = recording_span(trace)
    res, alloc = curves.reserved, curves.allocated
    pi = res.peak_index
    t_peak = int(res.time_us[pi])
    non_torch = _non_torch_at(curves, t_peak)
    # Reserved holds its peak until the next segment is freed; the block a new segment was made for is
    # handed out by the next event. The state shown at the peak is the fullest moment of that plateau.
    below = np.flatnonzero(res.bytes[pi:] != res.bytes[pi])
    plateau_end = pi + int(below[0]) if len(below) else len(res)
    k = pi + int(np.argmax(alloc.bytes[pi:plateau_end]))
    peak = Peak(
        t_peak, int(res.bytes[pi]), int(alloc.bytes[k]), path_at(trace, t_peak), k - 1, non_torch, int(alloc.time_us[k])
    )
    ai = alloc.peak_index
    peak_alloc = PeakPoint(
        "allocated", int(alloc.time_us[ai]), int(alloc.bytes[ai]), path_at(trace, int(alloc.time_us[ai]))
    )
    peak_dev = None
    if curves.has_device:
        di = curves.device_used.peak_index
        td = int(curves.device_used.time_us[di])
        peak_dev = PeakPoint("device_used", td, int(curves.device_used.bytes[di]), path_at(trace, td))
    target, source = resolve_target(trace, target_bytes)
    crossings = []
    if target is not None:
        for name, curve in (("reserved", res), ("device_used", curves.device_used)):
            c = crossing(trace, curve, target, name) if len(curve) else None
            if c is not None:
                crossings.append(c)
    holders = [
        HolderLine(h.stack, meaningful_frame(fr := trace.stack_frames(h.stack)), fr, h.bytes, h.count, h.share)
        for h in holders_by_stack(trace, top=top, event_index=peak.event_index, lt=lifetimes(trace))
    ]
    oom = trace.facts.get(FACT_OOM)
    return Summary(
        label=trace.label,
        process=trace.process,
        recording=trace.recording,
        env=dict(trace.facts.get(FACT_ENV) or {}),
        start_us=start_us,
        end_us=end_us,
        n_events=len(trace.events),
        n_samples=len(trace.samples),
        baseline=curves.baseline,
        peak=peak,
        peak_allocated=peak_alloc,
        peak_device_used=peak_dev,
        target_bytes=target,
        target_source=source,
        crossings=crossings,
        phases=phase_stats(trace, curves),
        holders=holders,
        hook_calls=list(trace.hook_calls),
        notes=list(trace.notes),
        warnings=_warnings(trace, curves),
        reconciliation=reconcile(trace, curves, target),
        kv=reconcile_kv(trace, curves),
        oom=oom if isinstance(oom, dict) else None,
        path=trace.path,
    )


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        for name in (
            "delta_reserved_bytes",
            "delta_allocated_bytes",
            "memtrace_non_kv_bytes",
            "memtrace_available_kv_bytes",
            "difference_bytes",
            "truncated",
        ):
            if hasattr(type(obj), name) and isinstance(getattr(type(obj), name), property):
                out[name] = _plain(getattr(obj, name))
        return out
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    return obj


def summary_to_dict(summary: Summary) -> dict[str, Any]:
    """A JSON-ready dict of ``summary``: exact integers of bytes and microseconds, nothing rounded."""
    return _plain(summary)


def worst(summaries: list[Summary]) -> Summary | None:
    """The trace closest to dying: the largest overshoot of its target, else the highest peak reserved."""
    if not summaries:
        return None

    def key(s: Summary) -> tuple[int, int]:
        over = max((c.overshoot_bytes for c in s.crossings), default=None)
        return (1 if over is not None else 0, over if over is not None else s.peak.reserved_bytes)

    return max(summaries, key=key)
