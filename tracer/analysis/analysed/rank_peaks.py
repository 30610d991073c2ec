"""The peak figures of one analysed rank: the peak, each quantity's highest point, the crossings of the target,
and what held memory at the peak.

:class:`PeakFigures` is the part of ``analysis.rank.AnalysedRank`` that reads the curves at their highest (every
rule from ``analysis.quantities``, the one home of the peak); the rest of ``AnalysedRank`` builds and keeps the
per-rank analyses these read (``trace``, ``curves``, ``target``, ``oom``, ``lifetimes``, ``frame_folders``,
``top``, ``recorded_nothing``). Each figure is a ``functools.cached_property``: computed once, on the rank.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
from memtrace.analysis.analysed.landmarks import steady_non_torch_at
from memtrace.analysis.analysed.summary import Headline, HolderLine, Peak, PeakPoint, holders_by_site
from memtrace.analysis.memory.crossing import Crossings, Excursion, crossings
from memtrace.analysis.memory.curves import Curve
from memtrace.analysis.memory.non_torch import NonTorchBreakdown, at_moments
from memtrace.analysis.memory.phases import path_at
from memtrace.analysis.memory.quantities import (
    ALLOCATED,
    HELD,
    RESERVED,
    fullest_at_peak,
    peak,
    ranked_by,
    whole_device_peak,
)
from memtrace.analysis.memory.vmm import live_kv_chunks


class PeakFigures:
    """The peak figures of an ``AnalysedRank`` (see the module docstring)."""

    @cached_property
    def peak(self) -> Peak:
        """The reserved peak and the fullest moment of its plateau (``quantities.peak``,
        ``quantities.fullest_at_peak``; see ``summary.Peak``): "the peak" of every output unless the process held
        more outside PyTorch (:attr:`headline` decides)."""
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
    def ranked_peak(self) -> PeakPoint:
        """This rank's peak of the quantity ranks are compared by (``quantities.ranked_by``): the reserved peak
        (:attr:`peak`), or PyTorch allocated's for the CPU's trace; 0 B when it recorded nothing."""
        if ranked_by(self.trace.process) is ALLOCATED:
            return self.peak_allocated
        p = self.peak
        return PeakPoint(RESERVED.key, p.time_us, p.reserved_bytes if not self.recorded_nothing else 0, p.phase_path)

    @cached_property
    def headline(self) -> Headline:
        """The quantity every output leads with and its peak, decided here once: :attr:`peak_held` where vLLM
        committed its KV cache outside PyTorch (the most the process held), else :attr:`ranked_peak` (PyTorch
        reserved at its fullest moment, or PyTorch allocated for the CPU's trace). The report's Peak section, the
        verdict, ``flame``'s default moment, the view's mark and the issue bundle's flame all read it."""
        if self.peak_held is not None:
            return Headline(HELD.key, self.peak_held, None, self.peak_held.time_us)
        if ranked_by(self.trace.process) is ALLOCATED:
            pa = self.peak_allocated
            return Headline(ALLOCATED.key, pa, self.curves.allocated.peak_index - 1, pa.time_us)
        return Headline(RESERVED.key, self.ranked_peak, self.peak.event_index, self.peak.state_us)

    @cached_property
    def headline_event(self) -> int:
        """The event right after which the state at the :attr:`headline` peak is read (-1: the baseline): its own
        event, or on the peak held the last event at or before its microsecond. What ``diff`` compares "at the
        peak" (its sites and categories), as the holders and the flame graph show it."""
        h = self.headline
        at = h.event_index
        return at if at is not None else int(np.searchsorted(self.event_times, h.point.time_us, side="right")) - 1

    # -- the target crossed ------------------------------------------------------------------------------

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
    def crossing_list(self) -> list[Excursion]:
        """The crossings found (first, then the other curve's), [] without a target or a crossing."""
        found = self.crossings
        return [e for e in (found.first, found.second) if e is not None] if found is not None else []

    @property
    def overshoot_bytes(self) -> int | None:
        """The largest overshoot of the target by any crossing (None when it never crossed)."""
        found = self.crossings
        over = [e.overshoot_bytes for e in (found.device_used, found.reserved) if e is not None] if found else []
        return max(over) if over else None

    # -- what held memory there ----------------------------------------------------------------------------

    @cached_property
    def holders(self) -> list[HolderLine]:
        """Live bytes at the run's :attr:`headline` peak by printed site, the ``top`` largest
        (``summary.holders_by_site``, with the KV cache committed outside PyTorch at the peak held): the state its
        flame shows, what every output names "at the peak"."""
        h, t = self.headline, self.headline.point.time_us
        # the peak held: the KV cache committed outside PyTorch then holds its part too
        at = {} if h.event_index is not None else {"t_us": t, "chunks": live_kv_chunks(self.trace, t)}
        return holders_by_site(self.trace, h.event_index, self.top, lt=self.lifetimes, **at)

    @cached_property
    def non_torch_moments(self) -> list[NonTorchBreakdown]:
        """Non-PyTorch memory by category at the first crossing and the peak (CUPTI; [] without records)."""
        first = self.crossing_list[0].time_us if self.crossing_list else None
        at = self.peak_device_used.time_us if self.peak_device_used is not None else self.peak.time_us
        return at_moments(self.trace, crossing_us=first, peak_us=at, curves=self.curves)
