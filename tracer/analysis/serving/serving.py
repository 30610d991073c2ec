"""The serving window of a trace (``MEMTRACE_UNTIL=serving``): what filled the GPU before it was written.

:func:`window_summary` reads ``Trace.window`` (``model.ServingWindow``) into plain data (:class:`WindowSummary`,
no peak of its own): PyTorch's state at the window's start and end (the start state plus the kept events, or the
allocator state saved with the last write), the growth by allocation site, what held the device at its end
(``serving_held``), the OOM inside the window and the scheduler steps before its end.

The window's NVML samples are the whole device's used memory (every process), as start-up's are. With the other
processes' series recorded beside them (format 1.5) the window's curves take it out, as start-up's do; a window
without it (format 1.4, or the worker not told apart) keeps them out of this process's curves altogether and
states them as the whole device's (:data:`quantities.DEVICE_USED_ALL`, :func:`device_used_all_curve`).

:func:`window_trace` is the window as a trace of its own (its events, samples and allocator state, one phase
``serving``), so that the curves, the OOM and ``flame --at oom`` read it with the machinery of a start-up:
the memory present before the window began is the allocator state at the write less the window's events
(``curves.baseline``), exact, the gap's dropped events included.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
from memtrace.analysis.analysed.self_cost import ServingCost, serving_cost
from memtrace.analysis.holders.frames import site_frame
from memtrace.analysis.memory.curves import Curve, all_curves, driver_reserved_bytes
from memtrace.analysis.memory.oom import Oom, find_oom
from memtrace.analysis.serving.serving_held import AllocatorState, DeviceAtEnd, allocator_state, device_at_end
from memtrace.model import ACTION_CODE, Frame, Phase, ServingWindow, Trace, empty_samples

_ALLOC, _FREE = ACTION_CODE["alloc"], ACTION_CODE["free_completed"]
_SEG_UP = (ACTION_CODE["segment_alloc"], ACTION_CODE["segment_map"])
_SEG_DOWN = (ACTION_CODE["segment_free"], ACTION_CODE["segment_unmap"])
#: How many scheduler steps before the window's end the outputs show.
STEPS_SHOWN = 5
#: The one phase of a window's trace (the OOM's phase in serving, ``capture.session.on_oom``).
SERVING_PHASE = "serving"


@dataclass
class SiteGrowth:
    """Bytes allocated at one site during the window and still live at its end."""

    frame: Frame | None
    bytes: int
    count: int


@dataclass
class WindowSummary:
    """What ``report`` and ``issue`` say about a serving window (bytes and Unix-epoch microseconds)."""

    window: ServingWindow
    start_allocated_bytes: int | None
    start_reserved_bytes: int | None
    start_exact: bool
    end_allocated_bytes: int | None
    end_reserved_bytes: int | None
    growth: list[SiteGrowth] = field(default_factory=list)
    #: the OOM the process died of inside the window (``analysis.oom.find_oom``); None when it did not
    oom: Oom | None = None
    steps_before_end: list[dict[str, Any]] = field(default_factory=list)
    #: the physical device's memory (an OOM's allocator limit is named when below it: ``Oom.limit_bytes``)
    device_total_bytes: int | None = None
    #: the allocator's state at the window's end, as torch's OOM message counts it (None: not saved)
    end_state: AllocatorState | None = None
    #: what held the device at the window's end (the OOM) and at start-up's end (``serving_held``)
    device: DeviceAtEnd | None = None
    #: the whole device's used memory over the window when it was not told apart into this process's and
    #: other processes' (:func:`device_used_all_curve`); None when it was, or was not sampled
    device_used_all: Curve | None = None
    #: the scheduler steps in progress when the window was written (``ServingWindow.steps_in_progress``); None
    #: when the window did not track them (format 1.4: a step was recorded when it ended)
    steps_in_progress: list[dict[str, Any]] | None = None
    #: memtrace's own cost from serving's start to the window's write (``self_cost.ServingCost``); None: a window
    #: written before format 1.6
    cost: ServingCost | None = None

    @property
    def step_at_oom(self) -> dict[str, Any] | None:
        """The scheduler step the OOM happened in: the last one in progress at the write that began by the OOM."""
        if self.oom is None or not self.steps_in_progress:
            return None
        begun = [s for s in self.steps_in_progress if int(s.get("time_us", 0)) <= self.oom.time_us]
        return max(begun, key=lambda s: int(s["time_us"]), default=None)

    @property
    def reserved_unused_bytes(self) -> int | None:
        """:data:`quantities.RESERVED_UNUSED` at the window's end (None without the allocator's state)."""
        return None if self.end_state is None else self.end_state.reserved_unused_bytes


def window_summary(trace: Trace, top: int = 10) -> WindowSummary | None:
    """The serving window's summary; None for a trace without one (a start-up-only trace)."""
    w = trace.window
    if w is None:
        return None
    state = w.start_state or {}
    a0, r0 = state.get("allocated_bytes"), state.get("reserved_bytes")
    ev = w.events
    a1 = r1 = None
    if a0 is not None and r0 is not None:
        a1 = int(a0) + _sum(ev, (_ALLOC,)) - _sum(ev, (_FREE,))
        r1 = int(r0) + _sum(ev, _SEG_UP) - _sum(ev, _SEG_DOWN)
    end_state = allocator_state(w.segments)
    if end_state is not None:  # the allocator's own state at the last write: exact whatever the ring dropped
        r1, a1 = end_state.reserved_bytes, end_state.allocated_bytes
    oom = find_oom(trace)
    in_window = oom is not None and w.start_us is not None and oom.time_us >= w.start_us
    return WindowSummary(
        window=w,
        start_allocated_bytes=None if a0 is None else int(a0),
        start_reserved_bytes=None if r0 is None else int(r0),
        start_exact=bool(state.get("exact")),
        end_allocated_bytes=a1,
        end_reserved_bytes=r1,
        growth=growth_by_site(trace, w, top),
        oom=oom if in_window else None,
        steps_before_end=list(w.steps[-STEPS_SHOWN:]),
        device_total_bytes=trace.process.device_total_bytes,
        end_state=end_state,
        device=device_at_end(trace, oom if in_window else None),
        device_used_all=device_used_all_curve(trace),
        steps_in_progress=None if w.steps_in_progress is None else list(w.steps_in_progress),
        cost=serving_cost(trace),
    )


def told_apart(w: ServingWindow) -> bool:
    """Whether the window's NVML samples were told apart into this process's and other processes' memory (the
    other processes' series recorded beside them, format 1.5)."""
    return bool(len(w.others))


def device_used_all_curve(trace: Trace) -> Curve | None:
    """The whole device's used memory over the window (:data:`quantities.DEVICE_USED_ALL`, in CUDA's accounting)
    when its samples were not told apart (:func:`told_apart`); None when they were, or none was taken."""
    w = trace.window
    if w is None or not len(w.samples) or told_apart(w):
        return None
    s = w.samples
    return Curve(s["time_us"].astype(np.int64), s["used_bytes"].astype(np.int64) - driver_reserved_bytes(trace))


def window_trace(trace: Trace) -> Trace | None:
    """The serving window as a trace of its own; None without a window or with no allocator events in it. Its
    events, allocator state and NVML samples are the window's (none when not :func:`told_apart`: the whole device's
    are never this process's), its one phase ``serving``; the process, stacks, facts, VMM calls and the notes of
    the window's time are the trace's."""
    w = trace.window
    if w is None or not len(w.events) or w.start_us is None or w.end_us is None:
        return None
    return Trace(
        process=trace.process,
        recording=replace(trace.recording, start_us=w.start_us, end_us=w.end_us, end_reason=w.reason),
        events=w.events,
        frames=trace.frames,
        stacks=trace.stacks,
        segments=w.segments,
        phases=[Phase(SERVING_PHASE, w.start_us, w.end_us, source="memtrace")],
        samples=w.samples if told_apart(w) else empty_samples(),
        others=w.others,
        vmm=trace.vmm,
        facts=trace.facts,
        notes=[n for n in trace.notes if n.time_us >= w.start_us],
        path=trace.path,
    )


def _sum(events: np.ndarray, codes: tuple[int, ...]) -> int:
    return int(events["size"][np.isin(events["action"], codes)].sum()) if len(events) else 0


def growth_by_site(trace: Trace, w: ServingWindow, top: int = 10) -> list[SiteGrowth]:
    """Allocations made in the window and not freed by its end, summed by their first meaningful frame."""
    ev = w.events
    if not len(ev):
        return []
    live: dict[int, tuple[int, int]] = {}  # addr -> (size, stack)
    for action, addr, size, stack in zip(
        ev["action"].tolist(), ev["addr"].tolist(), ev["size"].tolist(), ev["stack"].tolist(), strict=True
    ):
        if action == _ALLOC:
            live[addr] = (size, stack)
        elif action == _FREE:
            live.pop(addr, None)
    frame_of = {s: site_frame(trace, s) if s < len(trace.stacks) else None for _, s in live.values()}
    by: dict[Frame | None, SiteGrowth] = {}
    for size, stack in live.values():
        g = by.setdefault(frame_of[stack], SiteGrowth(frame_of[stack], 0, 0))
        g.bytes, g.count = g.bytes + size, g.count + 1
    return sorted(by.values(), key=lambda r: -r.bytes)[:top]


#: memtrace's cost's figures in ``report --json`` beside its fields (``self_cost.ServingCost``'s properties)
_COST_SHARES = ("total_ns", "share", "share_with_own_threads")
#: the window's own fields in ``report --json``, in order
_WINDOW_DOC = ("startup_end_us", "start_us", "end_us", "gap_us", "reason", "writes", "events_kept", "events_dropped",
               "samples_kept", "samples_dropped", "steps_kept", "steps_dropped", "bounds")  # fmt: skip


def window_doc(ws: WindowSummary) -> dict[str, Any]:
    """The window in ``report --json`` (bytes and microseconds)."""
    return {
        **{k: getattr(ws.window, k) for k in _WINDOW_DOC},
        "start": {"allocated": ws.start_allocated_bytes, "reserved": ws.start_reserved_bytes, "exact": ws.start_exact},
        "end": {
            "allocated": ws.end_allocated_bytes,
            "reserved": ws.end_reserved_bytes,
            "reserved_unused": ws.reserved_unused_bytes,
            "allocator": ws.end_state,
        },
        "device": ws.device,
        "growth": [
            {
                "site": None if g.frame is None else f"{g.frame.filename}:{g.frame.line} {g.frame.name}",
                "bytes": g.bytes,
                "count": g.count,
            }
            for g in ws.growth
        ],  # fmt: skip
        "oom": ws.oom,
        "steps_before_end": ws.steps_before_end,
        "steps_in_progress": ws.steps_in_progress,
        "step_at_oom": ws.step_at_oom,
        "cost": None
        if (c := ws.cost) is None
        else {k: getattr(c, k) for k in (*(f.name for f in fields(c)), *_COST_SHARES)},
    }


def joined(trace: Trace) -> Trace:
    """The run in time: start-up and its serving window as one trace: events, phases (then ``serving``) and NVML
    samples start-up's then the window's, the window's allocator state, and the gap between them no memory (every
    output says it as ``ServingWindow.gap_us``). A window that did not tell other processes apart (format 1.4) gets
    their series derived as ``serving_held`` does (``serving_held.DERIVED``); an OOM in the window adds the device's
    used memory torch's observer was given as one more sample. ``trace`` itself without a window, or when the two
    cannot be joined exactly (the ring dropped events, or the allocator state its events need is missing)."""
    w = trace.window
    if w is None or w.start_us is None or w.end_us is None or not (len(w.events) or len(w.samples)):
        return trace
    if w.events_dropped or (trace.segments and not w.segments):
        return trace
    reserve = driver_reserved_bytes(trace)
    samples = np.concatenate([trace.samples, w.samples]).astype(trace.samples.dtype)
    oom = find_oom(trace)
    total = trace.process.device_total_bytes
    if oom is not None and oom.time_us >= w.start_us and oom.free_bytes is not None and total:
        at_oom = np.array([(oom.time_us, total - oom.free_bytes + reserve)], dtype=samples.dtype)
        samples = np.sort(np.concatenate([samples, at_oom]), order="time_us", kind="stable")
    out = replace(
        trace,
        recording=replace(trace.recording, end_us=w.end_us, end_reason=w.reason or trace.recording.end_reason),
        events=np.concatenate([trace.events, w.events]).astype(trace.events.dtype),
        segments=w.segments or trace.segments,
        phases=[*trace.phases, Phase(SERVING_PHASE, w.start_us, w.end_us, source="memtrace")],
        samples=samples,
    )
    if told_apart(w) or not len(trace.others):
        others = np.concatenate([trace.others, w.others]).astype(trace.others.dtype)
        return replace(out, others=others)
    return replace(out, others=_derived_others(trace, out, w))


def _derived_others(startup: Trace, run: Trace, w: ServingWindow) -> np.ndarray:
    """Other processes' memory over the run when the window sampled the whole device only: start-up's series, then
    at each of the window's samples the device's used memory less this process's (PyTorch reserved + the KV cache
    committed outside it + its non-PyTorch memory at start-up's end: ``serving_held.DERIVED``)."""
    at_end = device_at_end(startup, None)
    non_torch = at_end.startup_end.non_torch_bytes if at_end is not None else None
    o = startup.others
    s = run.samples[run.samples["time_us"] >= w.start_us]
    if non_torch is None or not len(s):
        return o
    c = all_curves(replace(run, others=o))
    t = s["time_us"].astype(np.int64)
    mine = c.reserved.at_each(t) + c.vmm.at_each(t) + non_torch
    derived = np.empty(len(s), dtype=o.dtype)
    derived["time_us"], derived["others_bytes"] = t, s["used_bytes"] - driver_reserved_bytes(startup) - mine
    return np.concatenate([o, derived])
