"""What memtrace cost the traced program: its own time on the program's threads, by source, and the
allocator history's estimated cost, against vLLM's "init engine" span.

Reads the fact ``memtrace.self_cost`` (written by ``capture.session``; see ``memtrace.facts``). The
history's cost is PyTorch's (stacks gathered inside each allocation): it is estimated from the
calibration taken at start, per allocation at the calibration's stack depth plus per frame beyond it,
times the allocations this trace holds and their stacks' depths. Without a calibration (no GPU, an old
trace) it is *not measured*, never 0.

"init engine" is vLLM's own span (its log line "init engine (profile, create kv cache, warmup model)
took X s" times ``EngineCore._initialize_kv_caches``); in a worker's trace it runs from the start of
``determine_available_memory`` to the end of start-up (``vllm.startup_complete_us``, else the end of
the last top-level phase).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.model import ACTION_CODE, Trace

INIT_ENGINE_FIRST_PHASE = PN.DETERMINE_AVAILABLE_MEMORY
#: how a source's name groups in the one-line figure (prefix before the first dot)
HISTORY = "history (PyTorch, estimated)"


@dataclass(frozen=True)
class CostSource:
    name: str
    ns: int
    calls: int


@dataclass(frozen=True)
class SelfCost:
    """memtrace's cost in one trace. ``recorded`` False: an older trace, or (``by_memtrace`` False) a file
    memtrace did not record, whose program never ran memtrace (nothing else is set)."""

    recorded: bool
    by_memtrace: bool = True  # False: an imported file (a torch snapshot, a profiler trace)
    measured_ns: int = 0  # memtrace's own code, timed
    history_ns: int | None = None  # PyTorch's history recording, estimated; None: not measured
    history_why: str = ""  # why not measured
    sources: list[CostSource] = field(default_factory=list)  # largest first, the history estimate included
    memtrace_threads_ns: int = 0  # memtrace's own threads (not counted)
    init_engine_us: int | None = None
    startup_us: int | None = None  # init_device's start to the end of start-up
    process_startup_us: int | None = None  # the process's start to the end of start-up (fact process.start_us)

    @property
    def total_ns(self) -> int:
        return self.measured_ns + (self.history_ns or 0)

    @property
    def share_of_init_engine(self) -> float | None:
        return self.total_ns / (self.init_engine_us * 1000) if self.init_engine_us else None

    @property
    def share_of_process_startup(self) -> float | None:
        """Of the worker's whole start-up (process start to start-up complete): what a user waits for, most of
        memtrace's own time (registration, patching) coming before vLLM's "init engine" begins."""
        return self.total_ns / (self.process_startup_us * 1000) if self.process_startup_us else None


def history_estimate_ns(events: np.ndarray, stacks: list, calibration: dict, allocs: int | None = None) -> int | None:
    """PyTorch's cost of recording allocations, from the calibration (None if not measured): per allocation at
    the calibration's depth, plus per frame beyond it. ``allocs``: how many there were, when more than the alloc
    events given (a ring that dropped some): their frames beyond the depth are taken as the kept ones' mean."""
    if not calibration.get("measured"):
        return None
    per_alloc, per_frame = (float(calibration.get(k, 0.0)) for k in ("per_alloc_ns", "per_frame_ns"))
    depth0 = int(calibration.get("depth", 0))
    kept = events[events["action"] == ACTION_CODE["alloc"]]
    n = len(kept) if allocs is None else int(allocs)
    if not n:
        return 0
    extra = 0.0
    if len(kept):
        depths = np.array([len(s) for s in stacks] + [0], dtype=np.int64)  # index -1: no stack
        extra = float(np.maximum(depths[kept["stack"]] - depth0, 0).mean())
    return int(round(n * (per_alloc + per_frame * extra)))


@dataclass(frozen=True)
class ServingCost:
    """memtrace's cost while serving, from serving's start to the window's last write (``ServingWindow.cost``,
    format 1.6): its code on the program's threads (timed, by source), PyTorch's recording of the allocations
    made meanwhile (estimated from start-up's calibration; None: not measured, or serving kept other stacks than
    the calibration priced: ``MEMTRACE_SERVING_STACKS``) and memtrace's own threads (the
    NVML sampler, the background writer's conversions), which take the GIL from vLLM's threads while they run."""

    span_us: int
    measured_ns: int
    sources: list[CostSource]  # largest first, the history estimate included
    history_ns: int | None
    allocs: int | None
    memtrace_threads_ns: int

    @property
    def total_ns(self) -> int:
        return self.measured_ns + (self.history_ns or 0)

    @property
    def share(self) -> float | None:
        """Of the span, what memtrace and PyTorch's recording took on the program's threads."""
        return self.total_ns / (self.span_us * 1000) if self.span_us > 0 else None

    @property
    def share_with_own_threads(self) -> float | None:
        """The same with memtrace's own threads' time added (the most a GIL-bound engine can lose to them)."""
        return (self.total_ns + self.memtrace_threads_ns) / (self.span_us * 1000) if self.span_us > 0 else None


def _sources(cost: dict) -> list[CostSource]:
    items = (cost.get("sources") or {}).items()
    return [CostSource(str(k), int(v.get("ns", 0)), int(v.get("calls", 0))) for k, v in items if isinstance(v, dict)]


def serving_cost(trace: Trace) -> ServingCost | None:
    """memtrace's cost in the trace's serving window; None without a window, or one written before format 1.6."""
    w = trace.window
    cost = w.cost if w is not None else None
    if not cost or "since_us" not in cost or "until_us" not in cost:
        return None
    sources = _sources(cost)
    allocs = cost.get("allocs")
    calibration = (trace.facts.get(F.SELF_COST) or {}).get("history") or {}
    serving_stacks = (w.bounds or {}).get("stacks", trace.recording.stacks)
    if serving_stacks != trace.recording.stacks:  # start-up's calibration priced other stacks than serving kept
        calibration = {}
    history = None if allocs is None else history_estimate_ns(w.events, trace.stacks, calibration, int(allocs))
    if history is not None:
        sources.append(CostSource(HISTORY, history, int(allocs)))
    return ServingCost(
        span_us=int(cost["until_us"]) - int(cost["since_us"]),
        measured_ns=int(cost.get("total_ns", 0)),
        sources=sorted(sources, key=lambda s: -s.ns),
        history_ns=history,
        allocs=None if allocs is None else int(allocs),
        memtrace_threads_ns=int(cost.get("memtrace_threads_ns", 0)),
    )


def _init_engine_us(trace: Trace) -> tuple[int | None, int | None]:
    top = [p for p in trace.phases if p.parent is None]
    if not top:
        return None, None
    end = F.int_fact(trace.facts, F.VLLM_STARTUP_COMPLETE_US)
    end = max((p.end_us for p in top if p.end_us is not None), default=None) if end is None else end
    if end is None:
        return None, None
    first = next((p for p in top if p.name == INIT_ENGINE_FIRST_PHASE), None)
    init_engine = end - first.start_us if first is not None else None
    return init_engine, end - min(p.start_us for p in top)


def self_cost(trace: Trace) -> SelfCost:
    """memtrace's cost recorded in ``trace`` (``recorded`` False for a trace that predates it, and for a file
    memtrace did not record: ``by_memtrace`` False)."""
    if F.IMPORT in trace.facts:
        return SelfCost(recorded=False, by_memtrace=False)
    fact = trace.facts.get(F.SELF_COST)
    if not isinstance(fact, dict):
        return SelfCost(recorded=False)
    sources = _sources(fact)
    calibration = fact.get("history") or {}
    history = history_estimate_ns(trace.events, trace.stacks, calibration)
    if history is not None:
        sources.append(
            CostSource(HISTORY, history, int(np.count_nonzero(trace.events["action"] == ACTION_CODE["alloc"])))
        )
    init_engine, startup = _init_engine_us(trace)
    process_start = F.int_fact(trace.facts, F.PROCESS_START_US)
    end = F.int_fact(trace.facts, F.VLLM_STARTUP_COMPLETE_US)
    return SelfCost(
        recorded=True,
        measured_ns=int(fact.get("total_ns", sum(s.ns for s in sources if s.name != HISTORY))),
        history_ns=history,
        history_why="" if history is not None else str(calibration.get("why") or "no calibration in the trace"),
        sources=sorted(sources, key=lambda s: -s.ns),
        memtrace_threads_ns=int(fact.get("memtrace_threads_ns", 0)),
        init_engine_us=init_engine,
        startup_us=startup,
        process_startup_us=end - process_start if end is not None and process_start is not None else None,
    )
