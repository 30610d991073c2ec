"""TEST-ONLY reference implementations and conveniences, moved out of the package (issue 33: no function
in tracer/, plugins/ or plots/ that only tests call).

The package computes these figures another way (vectorised, streamed, or per analysed rank); the tests
hold the package to these slower, plainer versions, or use them to build their inputs.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import replace
from typing import Any

import numpy as np
from memtrace import facts as F
from memtrace.analysis.gate.diff import TraceDiff, _sides, category_changes, compare, figures
from memtrace.analysis.gate.diff_sites import site_changes
from memtrace.analysis.holders.live import lifetimes
from memtrace.analysis.memory.categories import CATEGORIES, OTHER, Categorized, categorize
from memtrace.analysis.memory.curves import Baseline, Curve, Curves, all_curves
from memtrace.analysis.memory.quantities import fullest_at_peak, is_one_moment, window_fullest
from memtrace.importers.files import traces_from_snapshot_file
from memtrace.importers.snapshot import traces_from_snapshot
from memtrace.model import ACTION_CODE, Trace
from memtrace.plots.memory_viz import _annotations, _entry, _fields, _is_host, _segments, with_free_requests
from memtrace.units import Threshold

_ALLOC, _FREE = ACTION_CODE["alloc"], ACTION_CODE["free_completed"]
_SEG_ALLOC, _SEG_FREE = ACTION_CODE["segment_alloc"], ACTION_CODE["segment_free"]


def baseline(trace: Trace) -> Baseline:
    """The memory present before recording began (``Curves.baseline``)."""
    return all_curves(trace).baseline


def _event_curve(trace: Trace, up: tuple[int, ...], down: tuple[int, ...], start: int) -> Curve:
    """``start``, then ``start`` + the running sum of +size (``up``) / -size (``down``) after every event."""
    ev = trace.events
    sign = np.isin(ev["action"], up).astype(np.int64) - np.isin(ev["action"], down)
    values = np.concatenate(([start], start + np.cumsum(sign * ev["size"].astype(np.int64)))).astype(np.int64)
    return Curve(all_curves(trace).reserved.time_us, values)


def allocated_curve(trace: Trace) -> Curve:
    """Bytes live in tensors (requested sizes), after every event."""
    return _event_curve(trace, (_ALLOC,), (_FREE,), baseline(trace).allocated_bytes)


def reserved_curve(trace: Trace) -> Curve:
    """Bytes PyTorch holds in segments, after every event (never raised to allocated, as ``all_curves`` does for
    a trace imported without its allocator state)."""
    up = (_SEG_ALLOC, ACTION_CODE["segment_map"])
    return _event_curve(trace, up, (_SEG_FREE, ACTION_CODE["segment_unmap"]), baseline(trace).reserved_bytes)


def category_curves(
    trace: Trace, categorized: Categorized | None = None, *, curves: Curves | None = None
) -> dict[str, Curve]:
    """Allocated bytes by category, on the time axis of ``allocated_curve`` (stack them in CATEGORIES order).

    At every index the values add up exactly to ``allocated_curve(trace).bytes``; the baseline
    (memory allocated before the first recorded event) starts in ``other``. Pass ``categorized`` and
    ``curves`` to share the work.
    """
    cat = categorized if categorized is not None else categorize(trace)
    curves = curves if curves is not None else all_curves(trace)
    base = curves.baseline.allocated_bytes
    times = curves.allocated.time_us
    action = trace.events["action"]
    delta = np.where(action == _FREE, -1, np.where(action == _ALLOC, 1, 0)) * trace.events["size"].astype(np.int64)
    out = {}
    for code, name in enumerate(CATEGORIES):
        start = base if code == OTHER else 0
        values = np.empty(len(delta) + 1, dtype=np.int64)
        values[0] = start
        np.cumsum(np.where(cat.codes == code, delta, 0), out=values[1:])
        if start:
            values[1:] += start
        out[name] = Curve(times, values)
    return out


class _Segments:
    """Active segments by start address, with a live-block count each."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.size: dict[int, int] = {}
        self.live: dict[int, int] = {}

    def add(self, start: int, size: int) -> None:
        if start not in self.size:
            bisect.insort(self.starts, start)
        self.size[start] = size
        self.live.setdefault(start, 0)

    def remove(self, start: int) -> None:
        if start in self.size:
            self.starts.pop(bisect.bisect_left(self.starts, start))
            del self.size[start]
            self.live.pop(start, None)

    def find(self, addr: int) -> int | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0:
            return None
        start = self.starts[i]
        return start if addr < start + self.size[start] else None


def pinned_loop(trace: Trace, curves: Curves) -> Curve:
    """The reference: one event at a time (the tests hold ``pinned.pinned_curve`` to it)."""
    ev = trace.events
    actions = ev["action"].tolist()
    addrs = ev["addr"].tolist()
    sizes = ev["size"].tolist()
    segs = _Segments()
    # segments from before recording: in the final snapshot without a recorded segment_alloc, or freed
    # during recording without one
    allocated_here = {a for a, act in zip(addrs, actions, strict=True) if act == _SEG_ALLOC}
    for s in trace.segments:
        if s.address not in allocated_here:
            segs.add(s.address, s.total_bytes)
    seen: set[int] = set()
    for a, act, size in zip(addrs, actions, sizes, strict=True):
        if act == _SEG_ALLOC:
            seen.add(a)
        elif act == _SEG_FREE and a not in seen and a not in segs.size:
            segs.add(a, size)
    # blocks live before recording
    lt = lifetimes(trace)
    for addr in lt.addr[lt.alloc_pos < 0].tolist():
        s = segs.find(addr)
        if s is not None:
            segs.live[s] += 1
    pinned = sum(segs.size[s] for s, n in segs.live.items() if n > 0)
    out = np.empty(len(ev) + 1, dtype=np.int64)
    out[0] = pinned
    for i, (a, act, size) in enumerate(zip(addrs, actions, sizes, strict=True)):
        if act == _ALLOC:
            s = segs.find(a)
            if s is not None:
                segs.live[s] += 1
                if segs.live[s] == 1:
                    pinned += segs.size[s]
        elif act == _FREE:
            s = segs.find(a)
            if s is not None and segs.live[s] > 0:
                segs.live[s] -= 1
                if segs.live[s] == 0:
                    pinned -= segs.size[s]
        elif act == _SEG_ALLOC:
            segs.add(a, size)
        elif act == _SEG_FREE:
            s = segs.find(a)
            if s is not None and segs.live.get(s, 0) > 0:
                pinned -= segs.size[s]
            if s is not None:
                segs.remove(s)
        out[i + 1] = pinned
    return Curve(curves.reserved.time_us, np.minimum(out, curves.reserved.bytes))


def snapshot_dict(trace: Trace, progress=None) -> dict[str, Any]:
    """The ``_snapshot()``-shaped dict of ``trace``, in memory (:func:`export_memory_viz` streams the
    same thing to a file without building it)."""
    device = trace.process.device_index or 0
    stacks = _frame_lists(trace)
    empty: list[dict[str, Any]] = []

    def frames_of(stack: int) -> list[dict[str, Any]]:
        return stacks[stack] if 0 <= stack < len(stacks) else empty

    which, values = _fields(trace)
    ev, which = with_free_requests(trace.events, which)
    cols = zip(
        ev["time_us"].tolist(), ev["action"].tolist(), ev["addr"].tolist(), ev["size"].tolist(),
        ev["stream"].tolist(), ev["stack"].tolist(), strict=True,
    )  # fmt: skip
    entries = [
        _entry(t, a, addr, size, stream, frames_of(stack), values[w] if w >= 0 else None)
        for (t, a, addr, size, stream, stack), w in zip(cols, which.tolist(), strict=True)
    ]
    if progress is not None:
        progress.advance()
    segments = _segments(trace, frames_of)
    if progress is not None:
        progress.advance()
    if _is_host(trace):  # pinned host memory goes back where torch 2.14 keeps it
        return {"segments": [], "device_traces": [], "host_segments": segments, "host_traces": entries}
    return {
        "segments": segments,
        "device_traces": [[] for _ in range(device)] + [entries],
        "external_annotations": _annotations(trace),
        "allocator_settings": trace.facts.get(F.ALLOCATOR_SETTINGS, {}),
    }


def trace_from_snapshot(snapshot: dict[str, Any], *, device: int | None = None, source: str = "snapshot") -> Trace:
    """One device's Trace (``device``, else the one with the most events): for single-device snapshots."""
    traces = traces_from_snapshot(snapshot, device=device, source=source)
    return max(traces, key=lambda t: len(t.events)) if device is None else traces[0]


def trace_from_snapshot_file(path: str | os.PathLike, *, device: int | None = None) -> Trace:
    """One device's trace of a snapshot pickle (``device``, else the one with the most events)."""
    traces = traces_from_snapshot_file(path, device=device)
    return max(traces, key=lambda t: len(t.events))


def diff_traces(base: Trace, new: Trace, threshold: Threshold, *, label: str = "") -> TraceDiff:
    """Compare ``new`` against ``base`` (the same process of two runs)."""
    bc, nc = all_curves(base), all_curves(new)
    device_level = bc.has_device and nc.has_device  # like with like: reserved-only unless both sampled NVML
    d = compare(
        figures(base, device_level=device_level, curves=bc),
        figures(new, device_level=device_level, curves=nc),
        threshold,
        label=label or new.label,
    )
    b, n = summarize(base, curves=bc), summarize(new, curves=nc)  # each on its own, read at its headline peak
    sites = site_changes(b, n)
    return replace(
        d,
        categories=category_changes(b, n),
        sites=sites.changes,
        sites_missing=sites.missing,
        one_moment=_sides(is_one_moment(base.facts), is_one_moment(new.facts)),
    )


def peak_event_index(allocated: Curve, reserved: Curve) -> int:
    """The event after which "the peak" is shown (``quantities.fullest_at_peak`` - 1); the event index the tests
    pass to ``flame_at``."""
    return fullest_at_peak(allocated, reserved) - 1


def window_peak_event_index(allocated: Curve, start_us: int, end_us: int) -> int:
    """``quantities.window_fullest`` - 1 (an event index); the event index."""
    return window_fullest(allocated, start_us, end_us) - 1


def _frame_lists(trace: Trace) -> list[list[dict[str, Any]]]:
    """One frames list per interned stack (shared objects: the pickle stores each once)."""
    frames = [{"filename": f.filename, "line": f.line, "name": f.name} for f in trace.frames]
    return [[frames[i] for i in stack] for stack in trace.stacks]


def summarize(trace: Trace, target=None, *, top: int = 10, curves: Curves | None = None):
    """TEST-ONLY: one trace analysed on its own (its own time origin): the ``AnalysedRank`` every output reads.

    Args:
        trace: the trace.
        target: ``analysis.target.resolve_target(trace, ...)`` (a ``Target``, never bare bytes); None: the
            recorded one.
        top: how many holders at the peak to keep.
        curves: the trace's ``all_curves``, when already built.
    """
    from memtrace.analysis.analysed.origin import TimeOrigin
    from memtrace.analysis.analysed.rank import AnalysedRank, TargetSpec
    from memtrace.analysis.memory.phases import recording_span
    from memtrace.analysis.memory.target import Target

    if target is not None and not isinstance(target, Target):
        raise TypeError("summarize takes a resolved Target (analysis.target.resolve_target), not bytes")
    origin = TimeOrigin(recording_span(trace)[0], (), True, "")
    rank = AnalysedRank(trace, TargetSpec(), origin, top=top, target=target, curves=curves)
    return rank


def snapshot_replay(raw: dict, device: int) -> tuple[int, int]:
    """(allocated, reserved) peaks of a raw snapshot by hand, no memtrace code: the final state from the segments,
    walked back through the history, then forward (tests/data/snapshots/README.md's independent replay)."""
    segs = [s for s in raw.get("segments", []) if s.get("device", 0) == device]
    reserved = sum(s["total_size"] for s in segs)
    held = sum(b.get("requested_size", b["size"]) for s in segs for b in s["blocks"] if b["state"].startswith("active"))
    history = raw["device_traces"][device] if device < len(raw["device_traces"]) else []
    up_a, down_a = {"alloc"}, {"free_completed"}
    up_r, down_r = {"segment_alloc", "segment_map"}, {"segment_free", "segment_unmap"}
    da = [e.get("size", 0) * ((e["action"] in up_a) - (e["action"] in down_a)) for e in history]
    dr = [e.get("size", 0) * ((e["action"] in up_r) - (e["action"] in down_r)) for e in history]
    a = peak_a = held - sum(da)
    r = peak_r = reserved - sum(dr)
    for x, y in zip(da, dr, strict=True):
        a, r = a + x, r + y
        peak_a, peak_r = max(peak_a, a), max(peak_r, r)
    return peak_a, peak_r
