"""One analysed rank: a trace with its target, and every figure an output shows, each computed once, lazily.

An :class:`AnalysedRank` is built by ``analysis.run.analyse`` (never by a renderer) from one trace (already
on the driver's clock), the run's target specification and the run's time origin. Each figure is a
``functools.cached_property``: computed on first use, kept on the object, shared by every renderer that
asks; nothing is cached anywhere else, and the trace is never modified.

Per rank: the ``target`` (``analysis.target.Target``, with its source: never flattened to bytes), the
``curves``, the allocations' ``lifetimes``, their ``categories`` (codes and curves), the ``oom``, the
``crossings`` (read up to the OOM), the ``summary`` (what ``memtrace report`` prints), the KV-sizing
``landmarks``, the ``non_kv`` model, CUPTI's ``cupti`` curve, the KV cache committed outside PyTorch
(``vmm``, ``vmm_kv``, vLLM 0.34's ``extensible`` sizing), torch's ``counter_checks``, and the ``verdict``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .. import facts as F
from ..model import Trace
from .categories import Categorized, CategorySteps, categorize, category_steps
from .crossing import Crossings, Excursion, crossings
from .curves import Curve, Curves, all_curves, committed_curve, vmm_reserved_curve
from .extensible import ExtensibleSizing, extensible_sizing
from .fingerprint import allocator_settings
from .fits import Fit, fits, recorded, smallest_fitting
from .fits_extensible import as_fit, is_extensible
from .fits_extensible import smallest as smallest_extensible
from .landmarks import Landmarks, landmarks, steady_non_torch_at
from .live import Lifetimes, lifetimes
from .non_torch import NonTorchBreakdown, at_moments, has_records, live_curve
from .oom import Oom, find_oom
from .origin import TimeOrigin
from .phases import PhaseStats, path_at, phase_path, phase_stats, recording_span
from .quantities import (
    BeforeRecording,
    PeakBound,
    before_recording,
    fullest_at_peak,
    in_vllm_terms,
    peak,
    peak_bound,
    whole_device_peak,
)
from .reconcile import NonKv, non_kv
from .self_cost import SelfCost, self_cost
from .summary import (
    HolderLine,
    HookTotal,
    Peak,
    PeakPoint,
    Summary,
    holders_by_site,
    hook_totals,
    memory_events,
    of_rank,
    warnings_of,
)
from .target import Target, resolve_target
from .torch_counters import CounterCheck, counter_checks
from .user_metadata import MetadataSpan, metadata_spans
from .view_paths import Paths, allocation_paths
from .view_window import RankQueries
from .vmm import VmmSummary
from .vmm import summary as vmm_summary

#: The verdicts of a rank and of a run, worst first.
DIED = "died"
UNFINISHED = "did not finish"  # a vLLM start-up that ended before it completed, not of CUDA OOM
CROSSED = "crossed"
WITHIN = "within target"
NO_TARGET = "no target"
NOTHING = "recorded nothing"


@dataclass(frozen=True)
class Unfinished:
    """A vLLM start-up that ended before it completed, not of CUDA OOM (:attr:`AnalysedRank.unfinished`)."""

    phase_path: str  # the last phase it entered
    end_us: int  # when the recording ended
    end_reason: str  # "exit", "signal:SIGTERM", "exception..."
    error_type: str | None = None  # the error that left the phase, when the plugin saw it
    error_message: str | None = None


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
    """The capacity what-if of one analysed rank: one ``fits.Fit`` per capacity asked, and the smallest card
    it fits on (``fits.smallest_fitting``)."""

    rank: AnalysedRank
    results: list[Fit]
    smallest: int | None

    @property
    def survives(self) -> bool:
        return all(r.survives for r in self.results)


class AnalysedRank:
    """One trace of an analysed run and its figures (see the module docstring)."""

    def __init__(
        self,
        trace: Trace,
        spec: TargetSpec,
        origin: TimeOrigin,
        *,
        top: int = 10,
        target: Target | None = None,
        curves: Curves | None = None,
    ) -> None:
        """``target``: one already resolved (else resolved from ``spec`` now); ``curves``: the trace's
        ``all_curves`` when already built (``summary.summarize``)."""
        self.trace = trace
        self.spec = spec
        self.origin = origin
        self.top = top
        # resolved at once: a target the trace cannot give (--util without a capacity) is a usage error now
        self.target: Target = target or resolve_target(trace, **spec.as_kwargs())
        self._fits: dict[tuple, RankFits] = {}
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
        """No allocator events: nothing to judge (a CPU-only worker, or recording never started). A snapshot of
        allocator state alone (``facts["import"]["state"] == "moment"``) has its segments to judge."""
        if (self.trace.facts.get(F.IMPORT) or {}).get("state") == "moment" and self.trace.segments:
            return False
        return len(self.trace.events) == 0

    @cached_property
    def unfinished(self) -> Unfinished | None:
        """How a vLLM start-up ended before it completed, other than by CUDA OOM, or None.

        A trace the vLLM plugin marked (phases of source "vllm") whose recording ended at the process's exit,
        a signal or an exception without the plugin's "start-up complete" fact: vLLM stopped itself (it
        refused to start: no room for one KV block, a bad flag) or was stopped. The last phase it entered
        and, when the plugin saw it (``facts.VLLM_STARTUP_ERROR``), the error say where and why."""
        t = self.trace
        reason = t.recording.end_reason
        if not any(p.source == "vllm" for p in t.phases) or F.VLLM_STARTUP_COMPLETE_US in t.facts:
            return None
        if reason != "exit" and not reason.startswith(("signal", "exception")):
            return None
        last = max(range(len(t.phases)), key=lambda i: (t.phases[i].start_us, i))
        error = t.facts.get(F.VLLM_STARTUP_ERROR) or {}
        return Unfinished(
            phase_path=phase_path(t, last),
            end_us=t.recording.end_us or self.span[1],
            end_reason=reason,
            error_type=error.get("type"),
            error_message=error.get("message"),
        )

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
    def crossings(self) -> Crossings | None:
        """Both curves' first excursions over the target, read up to the OOM (None without a target)."""
        oom_us = self.oom.time_us if self.oom is not None else None
        return crossings(self.trace, self.curves, self.target.target_bytes, oom_us=oom_us)

    @property
    def first_crossing(self) -> Excursion | None:
        """The crossing every output names first (device used when sampled and crossed, else reserved)."""
        return self.crossings.first if self.crossings is not None else None

    @cached_property
    def summary(self) -> Summary:
        """What ``memtrace report`` prints and its JSON holds: a view of this rank's figures (``summary.of_rank``)."""
        return of_rank(self)

    # -- the figures a report shows (the Summary view reads them; every output reads them from here) ------

    @cached_property
    def peak(self) -> Peak:
        """The reserved peak and the fullest moment of its plateau (``quantities.peak``,
        ``quantities.fullest_at_peak``; see ``summary.Peak``): "the peak" of every output."""
        t, c = self.trace, self.curves
        top = peak(c.reserved)
        k = fullest_at_peak(c.allocated, c.reserved)
        return Peak(
            top.time_us,
            top.bytes,
            int(c.allocated.bytes[k]),
            path_at(t, top.time_us),
            k - 1,
            steady_non_torch_at(c, top.time_us),
            int(c.allocated.time_us[k]),
        )

    def _peak_point(self, c: Curve, name: str) -> PeakPoint:
        top = peak(c)
        return PeakPoint(name, top.time_us, top.bytes, path_at(self.trace, top.time_us))

    @cached_property
    def peak_allocated(self) -> PeakPoint:
        """PyTorch allocated (requested) at its highest."""
        return self._peak_point(self.curves.allocated, "allocated")

    @cached_property
    def peak_device_used(self) -> PeakPoint | None:
        """NVML device used by this process at its highest (None when not sampled)."""
        return self._peak_point(self.curves.device_used, "device_used") if self.curves.has_device else None

    @cached_property
    def peak_others(self) -> PeakPoint | None:
        """Other processes' memory on the device at its highest (None when not sampled): never ours."""
        return self._peak_point(self.curves.others, "others") if len(self.curves.others) else None

    @cached_property
    def peak_held(self) -> PeakPoint | None:
        """PyTorch reserved + the KV cache committed outside PyTorch at its highest (None without VMM records)."""
        return self._peak_point(self.curves.held, "held") if len(self.curves.vmm) else None

    @cached_property
    def whole_device_peak_bytes(self) -> int | None:
        """Device used with other processes' memory put back, at its highest (None when others were not sampled)."""
        c = self.curves
        return whole_device_peak(c) if len(c.others) and c.has_device else None

    @cached_property
    def crossing_list(self) -> list[Excursion]:
        """The crossings found (first, then the other curve's), [] without a target or a crossing."""
        found = self.crossings
        return [e for e in (found.first, found.second) if e is not None] if found is not None else []

    @cached_property
    def holders(self) -> list[HolderLine]:
        """Live bytes at the peak by printed site, the ``top`` largest (``summary.holders_by_site``)."""
        return holders_by_site(self.trace, self.peak.event_index, self.top, lt=self.lifetimes)

    @cached_property
    def non_torch_moments(self) -> list[NonTorchBreakdown]:
        """Non-PyTorch memory by category at the first crossing and the peak (CUPTI; [] without records)."""
        first = self.crossing_list[0].time_us if self.crossing_list else None
        at = self.peak_device_used.time_us if self.peak_device_used is not None else self.peak.time_us
        return at_moments(self.trace, crossing_us=first, peak_us=at, curves=self.curves)

    @cached_property
    def n_events(self) -> int:
        """Allocator events that change memory (``summary.memory_events``)."""
        return memory_events(self.trace)

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
    def self_cost(self) -> SelfCost:
        """What memtrace cost the program (``analysis.self_cost``)."""
        return self_cost(self.trace)

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
        return vmm_reserved_curve(self.trace)

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
        """The capacity what-if (``analysis.fits``), computed once per question."""
        key = (tuple(capacities), util, non_torch_bytes)
        if key not in self._fits:
            rec = recorded(self.trace, non_torch_bytes, rank=self)
            if is_extensible(self.trace) and self.extensible is not None:  # vLLM 0.34: sized after warm-up
                found = [as_fit(self, c, util, rec) for c in capacities]
                self._fits[key] = RankFits(self, found, smallest_extensible(self, util, rec))
            else:
                found = fits(self.trace, list(capacities), util, rec=rec)
                self._fits[key] = RankFits(self, found, smallest_fitting(self.trace, util, rec=rec))
        return self._fits[key]

    @property
    def overshoot_bytes(self) -> int | None:
        """The largest overshoot of the target by any crossing (None when it never crossed)."""
        found = self.crossings
        over = [e.overshoot_bytes for e in (found.device_used, found.reserved) if e is not None] if found else []
        return max(over) if over else None

    @property
    def peak_reserved_bytes(self) -> int:
        return self.peak.reserved_bytes if not self.recorded_nothing else 0

    @property
    def verdict(self) -> str:
        """DIED, UNFINISHED, CROSSED, WITHIN (the target), NO_TARGET (nothing to compare with) or NOTHING (no
        events)."""
        if self.oom is not None:
            return DIED
        if self.unfinished is not None:
            return UNFINISHED
        if self.recorded_nothing:
            return NOTHING
        if self.target.target_bytes is None:
            return NO_TARGET
        return CROSSED if self.first_crossing is not None else WITHIN

    def seconds(self, t_us: int) -> float:
        """``t_us`` in seconds since the run's origin."""
        return self.origin.seconds(t_us)
