"""One analysed rank: a trace with its target, and every figure an output shows, each computed once, lazily.

An :class:`AnalysedRank` is built by ``analysis.run.analyse`` (never by a renderer) from one trace (already
on the driver's clock), the run's target specification and the run's time origin. Each figure is a
``functools.cached_property``: computed on first use, kept on the object, shared by every renderer that
asks; nothing is cached anywhere else, and the trace is never modified. This module builds and keeps the
per-rank analyses; the figures read at the curves' highest (the peak, each quantity's peak point, the
crossings, the holders at the peak) are ``analysis.rank_peaks.PeakFigures``, and the verdict's rules are
``analysis.verdict``.

Per rank: the ``target`` (``analysis.target.Target``, with its source: never flattened to bytes), the
``curves``, the allocations' ``lifetimes``, their ``categories`` (codes and curves), the ``oom``, the KV-sizing ``landmarks``, the ``non_kv`` model, CUPTI's
``cupti`` curve, the KV cache committed outside PyTorch (``vmm``, ``vmm_kv``, vLLM 0.34's ``extensible``
sizing), torch's ``counter_checks``, the capacity what-if (``fits``) and the ``verdict``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
from memtrace.analysis.analysed.fingerprint import allocator_settings
from memtrace.analysis.analysed.landmarks import Landmarks, landmarks
from memtrace.analysis.analysed.origin import TimeOrigin
from memtrace.analysis.analysed.rank_peaks import PeakFigures
from memtrace.analysis.analysed.self_cost import SelfCost, self_cost
from memtrace.analysis.analysed.summary import HookTotal, hook_totals, memory_events, warnings_of
from memtrace.analysis.analysed.verdict import (
    CROSSED as CROSSED,  # the verdicts, re-exported: callers import them from here too
)
from memtrace.analysis.analysed.verdict import DIED as DIED
from memtrace.analysis.analysed.verdict import NO_TARGET as NO_TARGET
from memtrace.analysis.analysed.verdict import NOTHING as NOTHING
from memtrace.analysis.analysed.verdict import UNFINISHED as UNFINISHED
from memtrace.analysis.analysed.verdict import WITHIN as WITHIN
from memtrace.analysis.analysed.verdict import Unfinished, recorded_nothing, unfinished, verdict
from memtrace.analysis.capacity.extensible import ExtensibleSizing, extensible_sizing
from memtrace.analysis.capacity.reconcile import NonKv, non_kv
from memtrace.analysis.holders.frames import LibraryDirs, library_dirs
from memtrace.analysis.holders.live import Lifetimes, lifetimes
from memtrace.analysis.holders.view_paths import Paths, allocation_paths
from memtrace.analysis.holders.view_window import RankQueries
from memtrace.analysis.memory.categories import Categorized, CategorySteps, categorize, category_steps
from memtrace.analysis.memory.curves import Curve, Curves, all_curves, committed_curve
from memtrace.analysis.memory.non_torch import has_records, live_curve
from memtrace.analysis.memory.oom import Oom, find_oom
from memtrace.analysis.memory.phases import PhaseStats, phase_stats, recording_span
from memtrace.analysis.memory.quantities import BeforeRecording, PeakBound, before_recording, in_vllm_terms, peak_bound
from memtrace.analysis.memory.target import Target, resolve_target
from memtrace.analysis.memory.torch_counters import CounterCheck, counter_checks
from memtrace.analysis.memory.user_metadata import MetadataSpan, TensorNote, metadata_spans, tensor_notes
from memtrace.analysis.memory.vmm import VmmSummary
from memtrace.analysis.memory.vmm import summary as vmm_summary
from memtrace.analysis.serving.serving import WindowSummary, joined, window_summary, window_trace
from memtrace.analysis.serving.serving_held import Room, room
from memtrace.model import Trace

if TYPE_CHECKING:
    from memtrace.analysis.capacity.fits import Fit


@dataclass(frozen=True)
class TargetSpec:
    """How the user asked for the target (``--target`` / ``--util`` [``--total``]); resolved per rank by
    ``analysis.target.resolve_target``. All None: the recorded target."""

    target_bytes: int | None = None
    util: float | None = None
    total_bytes: int | None = None

    def as_kwargs(self) -> dict:
        return {"target_bytes": self.target_bytes, "util": self.util, "total_bytes": self.total_bytes}


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
        self.target: Target = target or resolve_target(trace, **spec.as_kwargs())
        self._fits: dict[tuple, Any] = {}  # RankFits per question, capacity.boot.Boot per (util, non_torch_bytes)
        if curves is not None:
            self.__dict__["curves"] = curves  # the cached property, already computed

    def __repr__(self) -> str:
        return f"AnalysedRank({self.label}, {len(self.trace.events):,} events)"

    @cached_property
    def recorded_target(self) -> Target:
        """The target the trace itself gives (no flags): what ``fits`` sizes the recorded card from."""
        return resolve_target(self.trace)

    @property
    def label(self) -> str:
        return self.trace.label

    @property
    def rank(self) -> int | None:
        return self.trace.process.rank

    @property
    def recorded_nothing(self) -> bool:
        """No allocator events to judge (``verdict.recorded_nothing``)."""
        return recorded_nothing(self.trace)

    @cached_property
    def unfinished(self) -> Unfinished | None:
        """How a vLLM start-up ended before it completed, other than by CUDA OOM (``verdict.unfinished``)."""
        return unfinished(self.trace, self.span[1])

    @cached_property
    def span(self) -> tuple[int, int]:
        """(first, last) microsecond this rank knows about (``phases.recording_span``)."""
        return recording_span(self.trace)

    @cached_property
    def curves(self) -> Curves:
        return all_curves(self.trace)

    @cached_property
    def lifetimes(self) -> Lifetimes:
        return lifetimes(self.trace, self.event_times)

    @cached_property
    def categorized(self) -> Categorized:
        return categorize(self.trace, self.lifetimes)

    @cached_property
    def category_steps(self) -> CategorySteps:
        """Allocated bytes by category at any curve index, read where drawn (the timeline's pixels, the
        view's window) without building seven curves of every event."""
        return category_steps(self.trace, self.categorized, self.curves)

    @cached_property
    def cupti(self) -> Curve | None:
        """The non-PyTorch bytes CUPTI saw live (``non_torch.live_curve``); None without CUPTI records."""
        return live_curve(self.trace) if has_records(self.trace) else None

    @cached_property
    def oom(self) -> Oom | None:
        return find_oom(self.trace)

    @cached_property
    def n_events(self) -> int:
        """Allocator events that change memory (``summary.memory_events``)."""
        return memory_events(self.trace)

    @cached_property
    def n_samples(self) -> int:
        """NVML's samples as recorded: start-up's and its serving window's (not the OOM's own reading ``joined``
        adds)."""
        w = self.startup.window
        return len(self.startup.samples) + (len(w.samples) if w is not None else 0)

    @cached_property
    def frame_folders(self) -> LibraryDirs:
        """Where the recording process had torch, vLLM and FlashInfer (``frames.library_dirs``): how frames are told
        apart, by the holders and every output that names a frame."""
        return library_dirs(self.trace)

    @cached_property
    def hook_totals(self) -> list[HookTotal]:
        return hook_totals(self.trace)

    @cached_property
    def warnings(self) -> list[str]:
        return warnings_of(self.trace, self.curves)

    @cached_property
    def allocator(self) -> dict[str, str]:
        """The allocator settings in force (``fingerprint.allocator_settings``)."""
        return allocator_settings(self.trace)

    @cached_property
    def vllm(self) -> bool:
        """vLLM's terms (KV cache, non-KV memory) apply (``quantities.in_vllm_terms``)."""
        return in_vllm_terms(self.trace.facts)

    @cached_property
    def peak_bound(self) -> PeakBound:
        """How well the peaks are known (``quantities.peak_bound``): "at least" for a snapshot of one moment."""
        return peak_bound(self.trace.facts)

    @cached_property
    def before_recording(self) -> BeforeRecording | None:
        """PyTorch memory present before the recording began (``quantities.before_recording``): exact from the
        allocator's state, else a lower bound; None for a snapshot of one moment."""
        return before_recording(self.trace, self.curves)

    @cached_property
    def user_metadata(self) -> list[MetadataSpan]:
        """The user's labels on allocator events (``analysis.user_metadata``)."""
        return metadata_spans(self.trace)

    @cached_property
    def tensor_notes(self) -> list[TensorNote]:
        """The user's notes on live tensors (torch 2.14's ``_annotate_tensor``; ``analysis.user_metadata``)."""
        return tensor_notes(self.trace, self.lifetimes)

    @cached_property
    def self_cost(self) -> SelfCost:
        """What memtrace cost the program (``analysis.self_cost``)."""
        return self_cost(self.startup)

    @cached_property
    def window(self) -> WindowSummary | None:
        """The serving window after start-up (``analysis.serving``); None for a start-up-only trace."""
        return window_summary(self.startup)

    @cached_property
    def boot_rank(self) -> AnalysedRank:
        """Start-up alone (this rank when no serving window was joined to it): what "would it boot" is asked of
        (``analysis.capacity``: ``fits``, ``--suggest``, the what-if), whose model reads a start-up's phases and its
        end; the serving window is the serving question (:attr:`room`)."""
        if not self.joined:
            return self
        return AnalysedRank(self.startup, self.spec, self.origin, top=self.top, target=self.target, join=False)

    @cached_property
    def room(self) -> Room | None:
        """What would have left room for the request a serving OOM failed where the device ran out
        (``serving_held.room``, at the recorded utilization): the serving question; None otherwise."""
        ws = self.window
        if ws is None:
            return None
        return room(ws.device, ws.oom, self.recorded_target.util, self.trace.process.device_total_bytes)

    @cached_property
    def serving(self) -> AnalysedRank | None:
        """The serving window analysed as a rank of its own (``serving.window_trace``: its curves, its OOM,
        its flame graphs), on the run's time origin and this rank's target, drawn and queried apart after
        start-up; None when the window is :attr:`joined` into this rank's timeline (the rank holds it) or holds
        no allocator events."""
        if self.joined:
            return None
        t = window_trace(self.startup)
        return None if t is None else AnalysedRank(t, self.spec, self.origin, top=self.top, target=self.target)

    @cached_property
    def vmm(self) -> VmmSummary | None:
        """What vLLM (0.34+) committed through CUDA's VMM API, outside PyTorch (None before 0.34)."""
        return vmm_summary(self.trace)

    @cached_property
    def vmm_kv(self) -> Curve:
        """The KV cache committed through CUDA's VMM API, over time (empty before 0.34): the band every
        output draws beside PyTorch's, and the root the flame graph gives it."""
        return committed_curve(self.trace, kv_cache_only=True)

    @cached_property
    def vmm_address_space(self) -> Curve:
        """Address space reserved through CUDA's VMM API (``cuMemAddressReserve``), over time: not memory, the
        room the extensible KV cache may grow into; shown apart from memory, if at all (empty before 0.34)."""
        return committed_curve(self.trace, address_space=True)

    @cached_property
    def extensible(self) -> ExtensibleSizing | None:
        """vLLM 0.34's post-warm-up sizing of its extensible KV cache, term by term (None without one)."""
        return extensible_sizing(self.trace, self.curves)

    @cached_property
    def counter_checks(self) -> list[CounterCheck]:
        """memtrace's curves beside torch's own counters read by the plugin at vLLM's phase edges."""
        return counter_checks(self.trace, self.curves)

    @cached_property
    def landmarks(self) -> Landmarks:
        return landmarks(self.trace, self.curves)

    @cached_property
    def phases(self) -> list[PhaseStats]:
        """Every phase's figures (``phases.phase_stats``)."""
        return phase_stats(self.trace, self.curves)

    @cached_property
    def non_kv(self) -> NonKv | None:
        """vLLM's non-KV memory, the one model (``reconcile.non_kv``): what the report and ``fits`` show. None
        when the rank recorded nothing (a CPU worker's vLLM figures are not GPU memory: no figure from nothing)."""
        return None if self.recorded_nothing else non_kv(self.trace, self.curves)

    @cached_property
    def event_times(self) -> np.ndarray:
        """Event times made non-decreasing (as the curves'): curve index i + 1 is the state after event i."""
        return self.curves.allocated.time_us[1:]

    @cached_property
    def icicle_paths(self) -> Paths:
        """The flame graph's path of every allocation of ``lifetimes`` (``analysis.view_paths``): the view's icicle."""
        return allocation_paths(self.trace, self.lifetimes)

    @cached_property
    def queries(self) -> RankQueries:
        """The view's zoom and click queries (``analysis.view_window``), on the run's time origin."""
        return RankQueries(self, self.origin.t0_us)

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
        """DIED, UNFINISHED, CROSSED, WITHIN (the target), NO_TARGET (nothing to compare with) or NOTHING (no
        events): ``verdict.verdict``."""
        return verdict(
            died=self.oom is not None,
            stopped=self.unfinished is not None,
            nothing=self.recorded_nothing,
            has_target=self.target.target_bytes is not None,
            crossed=self.first_crossing is not None,
        )

    def seconds(self, t_us: int) -> float:
        """``t_us`` in seconds since the run's origin."""
        return self.origin.seconds(t_us)
