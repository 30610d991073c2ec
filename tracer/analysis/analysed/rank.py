"""One analysed rank: a trace with its target, and every figure an output shows, each computed once, lazily.

An :class:`AnalysedRank` is built by ``analysis.run.analyse`` (never by a renderer) from one trace (already on
the driver's clock), the run's target specification and time origin. Each figure is a :class:`figure` (a ``cached_property``): kept
on the object, shared by every renderer; the trace is never modified. The figures read at the curves' highest
are ``rank_peaks.PeakFigures``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from memtrace.analysis.analysed import verdict as V
from memtrace.analysis.analysed.fingerprint import allocator_settings
from memtrace.analysis.analysed.landmarks import landmarks
from memtrace.analysis.analysed.origin import TimeOrigin
from memtrace.analysis.analysed.rank_peaks import PeakFigures
from memtrace.analysis.analysed.self_cost import self_cost
from memtrace.analysis.analysed.summary import hook_totals, memory_events, warnings_of
from memtrace.analysis.capacity.extensible import extensible_sizing
from memtrace.analysis.capacity.reconcile import NonKv, non_kv
from memtrace.analysis.holders.frames import library_dirs
from memtrace.analysis.holders.live import lifetimes
from memtrace.analysis.holders.view_window import RankQueries, allocation_paths
from memtrace.analysis.memory.categories import categorize, category_steps
from memtrace.analysis.memory.curves import Curve, Curves, all_curves, committed_curve
from memtrace.analysis.memory.non_torch import has_records, live_curve
from memtrace.analysis.memory.oom import find_oom
from memtrace.analysis.memory.phases import phase_stats, recording_span
from memtrace.analysis.memory.quantities import before_recording, in_vllm_terms, peak_bound
from memtrace.analysis.memory.target import Target, resolve_target
from memtrace.analysis.memory.torch_counters import counter_checks
from memtrace.analysis.memory.user_metadata import metadata_spans, tensor_notes
from memtrace.analysis.memory.vmm import summary as vmm_summary
from memtrace.analysis.serving.serving import joined, window_summary, window_trace
from memtrace.analysis.serving.serving_held import Room, room
from memtrace.model import Trace

if TYPE_CHECKING:
    from memtrace.analysis.capacity.fits import Fit


class figure:  # noqa: N801 - a decorator, named as functools.cached_property is
    """A figure of the rank computed on first read and kept in the rank's ``__dict__``: ``functools.cached_property``
    without Python 3.11's one lock for every instance of the class (diff's two runs' analyses took turns behind it)."""

    def __init__(self, fn) -> None:
        self.fn, self.name, self.__doc__ = fn, None, getattr(fn, "__doc__", None)

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, rank, owner=None):
        if rank is None:
            return self
        value = rank.__dict__[self.name] = self.fn(rank)
        return value


def _of(fn, *needs: str) -> figure:
    """A figure of the rank computed once: ``fn`` of its attributes ``needs`` (dotted paths; "": the rank)."""
    return figure(lambda self: fn(*(attrgetter(n)(self) if n else self for n in needs)))


@dataclass(frozen=True)
class TargetSpec:
    """How the user asked for the target (``--target`` / ``--util`` [``--total``]); resolved per rank by
    ``analysis.target.resolve_target``. All None: the recorded target."""

    target_bytes: int | None = None
    util: float | None = None
    total_bytes: int | None = None


@dataclass(frozen=True)
class RankFits:
    """The capacity what-if of one analysed rank (``AnalysedRank.fits``): one ``fits.Fit`` per capacity asked,
    the smallest card it fits on, and, when that card's answer goes past the recording, where it comes from."""

    rank: AnalysedRank
    results: list[Fit]
    smallest: int | None
    smallest_prediction: str = ""

    @property
    def survives(self) -> bool:
        return all(r.survives for r in self.results)


class AnalysedRank(PeakFigures):
    """One trace of an analysed run and its figures (see the module docstring; the peak figures are
    ``rank_peaks.PeakFigures``)."""

    def __init__(
        self,
        trace: Trace,
        spec: TargetSpec,
        origin: TimeOrigin,
        *,
        top: int = 10,
        target: Target | None = None,
        curves: Curves | None = None,
        join: bool = True,
    ) -> None:
        """``target``: one already resolved (else resolved from ``spec`` now); ``curves``: the trace's
        ``all_curves`` when already built; ``join``: False keeps the serving window apart
        (:attr:`boot_rank`)."""
        #: the trace as recorded: start-up, with its serving window apart (``Trace.window``)
        self.startup = trace
        #: the run in time (``serving.joined``): start-up then its serving window, one timeline every figure covers
        self.trace = joined(trace) if join else trace
        #: the serving window is in :attr:`trace`'s timeline (``serving.joined``), decided here once: every output
        #: reads it (then :attr:`serving` is None: no window drawn, counted or queried apart)
        self.joined = self.trace is not trace
        self.spec = spec
        self.origin = origin
        self.top = top
        # resolved at once: a target the trace cannot give (--util without a capacity) is a usage error now
        self.target: Target = target or resolve_target(trace, **vars(spec))
        self._fits: dict[tuple, Any] = {}  # RankFits per question, capacity.boot.Boot per (util, non_torch_bytes)
        if curves is not None:
            self.__dict__["curves"] = curves  # the cached property, already computed

    def __repr__(self) -> str:
        return f"AnalysedRank({self.label}, {len(self.trace.events):,} events)"

    @property
    def label(self) -> str:
        return self.trace.label

    @property
    def rank(self) -> int | None:
        return self.trace.process.rank

    # each figure: ``fn`` of the rank's attributes, computed once (the function's docstring says what it is)
    recorded_target = _of(resolve_target, "trace")  # the target the trace gives (no flags): fits' recorded card
    recorded_nothing = _of(V.recorded_nothing, "trace")
    span = _of(recording_span, "trace")
    curves = _of(all_curves, "trace")
    lifetimes = _of(lifetimes, "trace", "event_times")
    categorized = _of(categorize, "trace", "lifetimes")
    category_steps = _of(category_steps, "trace", "categorized", "curves")
    oom = _of(find_oom, "trace")
    n_events = _of(memory_events, "trace")
    frame_folders = _of(library_dirs, "trace")
    hook_totals = _of(hook_totals, "trace")
    warnings = _of(warnings_of, "trace", "curves")
    allocator = _of(allocator_settings, "trace")
    before_recording = _of(before_recording, "trace", "curves")
    user_metadata = _of(metadata_spans, "trace")
    tensor_notes = _of(tensor_notes, "trace", "lifetimes")
    self_cost = _of(self_cost, "startup")
    window = _of(window_summary, "startup")  # the serving window after start-up (None for start-up alone)
    vmm = _of(vmm_summary, "trace")
    vmm_address_space = _of(partial(committed_curve, address_space=True), "trace")  # not memory: the KV cache's room
    extensible = _of(extensible_sizing, "trace", "curves")
    counter_checks = _of(counter_checks, "trace", "curves")
    landmarks = _of(landmarks, "trace", "curves")
    phases = _of(phase_stats, "trace", "curves")
    icicle_paths = _of(allocation_paths, "trace", "lifetimes")  # the view's icicle
    vllm = _of(in_vllm_terms, "trace.facts")
    peak_bound = _of(peak_bound, "trace.facts")
    vmm_kv = _of(partial(committed_curve, kv_cache_only=True), "trace")  # the KV cache committed outside PyTorch
    #: event times made non-decreasing (as the curves'): curve index i + 1 is the state after event i
    event_times = _of(lambda c: c.allocated.time_us[1:], "curves")
    queries = _of(RankQueries, "", "origin.t0_us")  # the view's zoom and click queries, on the run's time origin

    @figure
    def unfinished(self) -> V.Unfinished | None:
        """How a vLLM start-up ended before it completed, other than by CUDA OOM (``verdict.unfinished``)."""
        return V.unfinished(self.trace, self.span[1])

    @figure
    def cupti(self) -> Curve | None:
        """The non-PyTorch bytes CUPTI saw live (``non_torch.live_curve``); None without CUPTI records."""
        return live_curve(self.trace) if has_records(self.trace) else None

    @figure
    def n_samples(self) -> int:
        """NVML's samples as recorded: start-up's and its serving window's (not the OOM's own reading ``joined``
        adds)."""
        w = self.startup.window
        return len(self.startup.samples) + (len(w.samples) if w is not None else 0)

    @figure
    def boot_rank(self) -> AnalysedRank:
        """Start-up alone (this rank when no serving window was joined to it): what "would it boot" is asked of
        (``analysis.capacity``: ``fits``, ``--suggest``, the what-if), whose model reads a start-up's phases and its
        end; the serving window is the serving question (:attr:`room`)."""
        if not self.joined:
            return self
        return AnalysedRank(self.startup, self.spec, self.origin, top=self.top, target=self.target, join=False)

    @figure
    def room(self) -> Room | None:
        """What would have left room for the request a serving OOM failed where the device ran out
        (``serving_held.room``, at the recorded utilization): the serving question; None otherwise."""
        ws = self.window
        return (
            None
            if ws is None
            else room(ws.device, ws.oom, self.recorded_target.util, self.trace.process.device_total_bytes)
        )

    @figure
    def serving(self) -> AnalysedRank | None:
        """The serving window analysed as a rank of its own (``serving.window_trace``: its curves, its OOM,
        its flame graphs), on the run's time origin and this rank's target, drawn and queried apart after
        start-up; None when the window is :attr:`joined` into this rank's timeline (the rank holds it) or holds
        no allocator events."""
        t = None if self.joined else window_trace(self.startup)
        return None if t is None else AnalysedRank(t, self.spec, self.origin, top=self.top, target=self.target)

    @figure
    def non_kv(self) -> NonKv | None:
        """vLLM's non-KV memory, the one model (``reconcile.non_kv``): what the report and ``fits`` show. None
        when the rank recorded nothing (a CPU worker's vLLM figures are not GPU memory: no figure from nothing)."""
        return None if self.recorded_nothing else non_kv(self.trace, self.curves)

    def fits(self, capacities: list[int], util: float | None = None, non_torch_bytes: int | None = None) -> RankFits:
        """The capacity what-if (``analysis.boot``: the capacity model, the what-if model past the recording),
        computed once per question."""
        key = ("fits", tuple(capacities), util, non_torch_bytes)
        if key not in self._fits:
            b = self.boot(util, non_torch_bytes)
            self._fits[key] = RankFits(self, [b.fit(c) for c in capacities], b.smallest, b.smallest_prediction)
        return self._fits[key]

    def boot(self, util: float | None = None, non_torch_bytes: int | None = None, others_bytes: int = 0):
        """Will it boot with the recorded flags (``analysis.capacity.boot.Boot``; ``others_bytes``: held by other
        processes on the card), one per question, each card answered once."""
        if self.boot_rank is not self:  # start-up alone answers, as for fits (a joined serving window is not start-up)
            return self.boot_rank.boot(util, non_torch_bytes, others_bytes)
        key = (util, non_torch_bytes, others_bytes)
        if key not in self._fits:
            # the what-if engine is imported when asked (report, plot and view never ask: ~30 ms of imports)
            from memtrace.analysis.capacity.boot import Boot

            self._fits[key] = Boot(self, util, non_torch_bytes, others_bytes)
        return self._fits[key]

    @property
    def verdict(self) -> str:
        """The worst verdict that applies: DIED (a CUDA OOM), UNFINISHED (stopped before start-up completed),
        NOTHING (no events), NO_TARGET (nothing to compare with), CROSSED or WITHIN (the target)."""
        if self.oom is not None:
            return V.DIED
        if self.unfinished is not None:
            return V.UNFINISHED
        if self.recorded_nothing:
            return V.NOTHING
        if self.target.target_bytes is None:
            return V.NO_TARGET
        return V.CROSSED if self.first_crossing is not None else V.WITHIN

    def seconds(self, t_us: int) -> float:
        """``t_us`` in seconds since the run's origin."""
        return self.origin.seconds(t_us)
