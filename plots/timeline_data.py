"""What the timeline draws for one process, gathered from the analysis (no drawing here).

``prepare_rank(rank)`` takes what a renderer needs from an analysed rank (``analysis.rank.AnalysedRank``,
where every figure is computed once), so ``timeline.render_timeline`` never touches a Trace's events:

- the curves and the categories of allocated memory (``analysis.curves``, ``analysis.categories``);
- the phases (``analysis.phases.phase_stats``);
- the target and the card (``analysis.target.resolve_target``: the one resolver every output uses);
- the OOM the run died of (``analysis.oom.find_oom``) and the first crossing of the target, read up
  to that OOM (``analysis.crossing``: the one definition report and plot share);
- the non-PyTorch bytes CUPTI saw live (``analysis.non_torch.live_curve``), when the trace holds CUPTI
  records: the timeline splits its non-PyTorch band with it (:func:`cupti_split`: where each part
  runs, in bytes, once the renderer has picked the NVML samples it draws);
- the serving window (``AnalysedRank.serving``), prepared the same way, and the gap before it; NVML's samples of a
  window that did not tell other processes apart are the whole device's (``WindowSummary.device_used_all``);
- the KV cache vLLM (0.34+) committed through CUDA's VMM API, outside PyTorch (``AnalysedRank.vmm_kv``):
  a band stacked on PyTorch reserved (:func:`vmm_band`), the KV cache's category allocated another way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from memtrace.analysis.analysed.fingerprint import describe_run
from memtrace.analysis.analysed.rank import AnalysedRank
from memtrace.analysis.memory import quantities
from memtrace.analysis.memory.categories import CategorySteps
from memtrace.analysis.memory.crossing import Crossings, Excursion
from memtrace.analysis.memory.curves import Curve, Curves
from memtrace.analysis.memory.oom import Oom
from memtrace.analysis.memory.phases import PhaseStats
from memtrace.analysis.memory.target import Target
from memtrace.plots.downsample import bucket_indices
from memtrace.units import GiB, axis_unit


@dataclass(frozen=True)
class RankTimeline:
    """One process's curves and figures, ready to draw."""

    label: str
    curves: Curves
    categories: CategorySteps  # allocated bytes by category, read at the drawn indices
    phases: list[PhaseStats]
    start_us: int
    end_us: int
    target: Target
    crossings: Crossings | None
    oom: Oom | None
    device_total_bytes: int | None = None  # the physical device (an OOM's limit may be lower)
    description: str = ""  # what ran, with what, on what (``titles.describe_run``): the default title
    #: the non-PyTorch bytes CUPTI saw live (``non_torch.live_curve``); None without CUPTI records
    cupti: Curve | None = None
    #: the KV cache committed through CUDA's VMM API (``AnalysedRank.vmm_kv``); None when nothing was
    vmm_kv: Curve | None = None
    #: the serving window after start-up (``AnalysedRank.serving``), drawn after the gap, for a window that could
    #: not be joined to start-up (``serving.joined``: its ring dropped events); None without one, or joined
    serving: RankTimeline | None = None
    #: the serving window's span (microseconds) where it is part of this rank's own curves (``serving.joined``)
    window_us: tuple[int, int] | None = None
    #: the gap between start-up's end and the window's first kept record (microseconds), and what the ring
    #: dropped in it (allocator events, NVML samples, scheduler steps); None without a gap
    gap_us: tuple[int, int] | None = None
    gap_dropped: tuple[int, int, int] = (0, 0, 0)
    #: the whole device's used memory, every process, where NVML's samples were not told apart into this
    #: process's and other processes' (a serving window of format 1.4: ``WindowSummary.device_used_all``)
    device_used_all: Curve | None = None
    #: whether the trace has PyTorch reserved memory (``quantities.holds_reserved``): not a torch.profiler trace
    #: of the CPU, whose curves are PyTorch allocated alone (its 'Total Reserved' stays 0)
    holds_reserved: bool = True
    #: the y axis's unit, (name, bytes) (``units.axis_unit`` of the highest figure drawn): GiB for a start-up,
    #: KiB for a CPU profiler trace's KiB-sized curves
    unit: tuple[str, int] = ("GiB", GiB)
    #: the highest figure drawn from the data (curves, the window's, the whole device, the target): what ``unit`` is
    #: chosen from, and the least the y axis reaches (``timeline_axes.draw_main`` adds the capacity lines)
    top_bytes: int = 0
    #: a snapshot of one moment (``quantities.is_one_moment``): no time axis, no zoom panel, said so on the image
    one_moment: bool = False
    #: other processes filled the device far above what this process used (a shared card): the y axis keeps this
    #: process's own scale and their band runs above it (``top_bytes`` leaves the whole device out)
    others_off_scale: bool = False

    @property
    def peak_curve(self) -> Curve:
        """The curve whose peak the zoom panel looks at and names: what the process held (PyTorch reserved, plus
        what was committed through CUDA's VMM API), or PyTorch allocated in a trace without reserved memory."""
        return self.curves.held if self.holds_reserved else self.curves.allocated

    @property
    def peak_name(self) -> str:
        """The name the zoom panel gives :attr:`peak_curve`'s peak."""
        if not self.holds_reserved:
            return "allocated"
        return "held (PyTorch + VMM)" if self.vmm_kv is not None else "reserved"

    @property
    def drawn_end_us(self) -> int:
        """Where this rank's own curves stop: start-up's end when a serving window follows, else the end."""
        return self.gap_us[0] if self.gap_us is not None and self.serving is not None else self.end_us

    @property
    def lane_phases(self) -> list[PhaseStats]:
        """The phase lane's bars: start-up's phases, then the serving window's one (``serving``), when drawn."""
        return self.phases + (self.serving.phases if self.serving is not None else [])

    @property
    def oom_rank(self) -> RankTimeline:
        """The part that holds the OOM: the serving window when it died there, else this rank."""
        return self.serving if self.serving is not None and self.serving.oom is not None else self

    @property
    def serves(self) -> bool:
        """Whether a serving window follows start-up on this rank's timeline (joined or drawn apart)."""
        return self.serving is not None or self.window_us is not None

    @property
    def target_bytes(self) -> int | None:
        return self.target.target_bytes

    @property
    def capacity_bytes(self) -> int | None:
        """The card: ``--total``, the card the run stood for, else the device (``Target.capacity_bytes``)."""
        return self.target.capacity_bytes

    @property
    def util(self) -> float | None:
        return self.target.util

    def first_crossing(self) -> Excursion | None:
        """The crossing the figure names (``Crossings.first``: device used when sampled, else reserved)."""
        return self.crossings.first if self.crossings is not None else None


def prepare_rank(rank: AnalysedRank) -> RankTimeline:
    """What the timeline draws of one analysed rank (``analysis.rank.AnalysedRank``): its figures, read
    from the rank (computed there once), never recomputed here."""
    start, end = rank.span
    serving, gap, dropped, window, used_all = None, None, (0, 0, 0), None, None
    tops = [_top(rank.curves), rank.target.target_bytes or 0]
    w = rank.startup.window
    if rank.joined:  # one run in time: the window is in the rank's curves
        window = (w.start_us, w.end_us)
        gap = (w.startup_end_us, w.start_us) if w.gap_us else None
        dropped = (w.events_dropped, w.samples_dropped, w.steps_dropped)
        used_all = rank.window.device_used_all  # a 1.4 window's samples as NVML read them: the whole device
    elif rank.serving is not None:
        serving = prepare_rank(rank.serving)
        serving = replace(serving, device_used_all=rank.window.device_used_all)
        gap = (w.startup_end_us, w.start_us) if w.gap_us else None
        dropped = (w.events_dropped, w.samples_dropped, w.steps_dropped)
        end = max(end, serving.end_us)
        used_all = rank.window.device_used_all
        tops += [_top(rank.serving.curves), used_all.peak_bytes if used_all is not None else 0]
    whole = quantities.whole_device_peak(rank.curves) if rank.curves.others.bytes.any() else 0
    own = max(tops)
    off_scale = whole > OFF_SCALE * own  # a neighbour filled the card: this process keeps its own scale
    top = own if off_scale else max(own, whole)
    unit = axis_unit(top)
    if serving is not None:  # drawn on the same axes as start-up: one unit
        serving = replace(serving, unit=unit)
    return RankTimeline(
        label=rank.label,
        curves=rank.curves,
        categories=rank.category_steps,
        phases=rank.phases,
        start_us=start,
        end_us=max(end, start + 1),
        target=rank.target,
        crossings=rank.crossings,
        oom=rank.oom,
        device_total_bytes=rank.trace.process.device_total_bytes,
        device_used_all=used_all,
        description=describe_run(rank.trace),
        cupti=rank.cupti,
        vmm_kv=rank.vmm_kv if rank.vmm_kv.bytes.any() else None,
        serving=serving,
        window_us=window,
        gap_us=gap,
        gap_dropped=dropped,
        holds_reserved=quantities.holds_reserved(rank.trace.process),
        unit=unit,
        top_bytes=top,
        one_moment=quantities.is_one_moment(rank.trace.facts),
        others_off_scale=off_scale,
    )


#: Other processes' memory runs above the y axis when the whole device's peak is more than this many times this
#: process's own top (its curves and its target): drawn to the card, this process's crossing would be a sliver.
OFF_SCALE = 1.6


def _top(curves: Curves) -> int:
    """The highest figure among ``curves`` of this process that a timeline draws: allocated, held, device used."""
    used = curves.device_used.peak_bytes if curves.has_device else 0
    return max(curves.allocated.peak_bytes, curves.held.peak_bytes, used)


@dataclass(frozen=True)
class CuptiSplit:
    """The non-PyTorch band split as drawn, in bytes on one time grid (step "post"): PyTorch reserved,
    the top of what CUPTI saw (reserved + CUPTI's bytes, clipped to NVML device used) and device used.

    The grid is the drawn NVML samples and CUPTI's steps between the first and the last of them; reserved
    and device used are the drawn samples' (the band as without CUPTI), CUPTI's bytes the curve's value
    in force.
    """

    time_us: np.ndarray
    reserved_bytes: np.ndarray
    cupti_top_bytes: np.ndarray
    used_bytes: np.ndarray

    @property
    def cupti_bytes(self) -> np.ndarray:
        """CUPTI's bytes as drawn (never more than NVML's non-PyTorch at that moment)."""
        return self.cupti_top_bytes - self.reserved_bytes


def cupti_split(rank: RankTimeline, keep: np.ndarray, lo: int, hi: int, n_buckets: int) -> CuptiSplit:
    """Where the band of what CUPTI saw runs, given ``keep``: the NVML samples drawn over [lo, hi]."""
    used, nt, cupti = rank.curves.device_used, rank.curves.non_torch, rank.cupti
    t_nvml = used.time_us[keep]
    steps = cupti.time_us[bucket_indices(cupti.time_us, cupti.bytes, lo, hi, n_buckets)]
    grid = np.union1d(t_nvml, steps[(steps > t_nvml[0]) & (steps < t_nvml[-1])])
    j = np.searchsorted(t_nvml, grid, side="right") - 1  # the drawn sample in force
    u = used.bytes[keep][j]
    r = u - nt.bytes[keep][j]
    c = cupti.at_each(grid)
    return CuptiSplit(grid, r, r + np.clip(c, 0, np.maximum(u - r, 0)), u)


@dataclass(frozen=True)
class VmmBand:
    """The KV cache committed outside PyTorch as drawn, in bytes on one time grid (step "post"): from
    PyTorch reserved (the drawn samples' value in force) up to reserved + the KV cache's VMM bytes.

    The grid is the drawn reserved samples, every step of the VMM curve within [lo, hi] and ``hi`` itself
    (so the last value is the one at the end of the drawn range)."""

    time_us: np.ndarray
    reserved_bytes: np.ndarray
    top_bytes: np.ndarray

    @property
    def kv_bytes(self) -> np.ndarray:
        """The KV cache's VMM bytes at each grid time (exact: the curve's value in force)."""
        return self.top_bytes - self.reserved_bytes


def vmm_band(rank: RankTimeline, lo: int, hi: int, n_buckets: int) -> VmmBand | None:
    """Where the band of the KV cache committed through CUDA's VMM API runs over [lo, hi]; None without one."""
    kv = rank.vmm_kv
    if kv is None:
        return None
    res = rank.curves.reserved
    keep = bucket_indices(res.time_us, res.bytes, lo, hi, n_buckets)
    t_res = res.time_us[keep]
    steps = kv.time_us[(kv.time_us >= lo) & (kv.time_us <= hi)]
    grid = np.union1d(np.union1d(t_res, steps), [lo, hi]).astype(np.int64)
    grid = grid[(grid >= min(lo, int(t_res[0]) if len(t_res) else lo)) & (grid <= hi)]
    if len(t_res):
        j = np.searchsorted(t_res, grid, side="right") - 1
        r = np.where(j >= 0, res.bytes[keep][np.clip(j, 0, None)], 0).astype(np.int64)
    else:
        r = np.zeros(len(grid), dtype=np.int64)
    return VmmBand(grid, r, r + kv.at_each(grid))


def landmark_times_us(rank: RankTimeline) -> list[int]:
    """The moments the figure names: the peak of what the process held, the peak of device used, the first
    crossing of the target (and its excursion's maximum), the OOM."""
    out = [quantities.peak(c).time_us for c in (rank.curves.held, rank.curves.device_used) if len(c)]
    c = rank.first_crossing()
    if c is not None:
        out += [c.time_us, c.max_us]
    if rank.oom is not None:
        out.append(rank.oom.time_us)
    if rank.serving is not None:
        out += landmark_times_us(rank.serving)
    return out


def phases_at(rank: RankTimeline, times_us: list[int]) -> frozenset[str]:
    """The paths of the phases (every depth) that any of ``times_us`` falls in."""
    return frozenset(p.path for p in rank.lane_phases for t in times_us if p.start_us <= t <= p.end_us)


def drawn_curves(rank: RankTimeline) -> list[Curve]:
    """The curves the main plot draws: PyTorch allocated, held by this process, device used (when sampled; the
    whole device's where it was not told apart)."""
    c = rank.curves
    own = [c.allocated, c.held] + ([c.device_used] if c.has_device else [])
    own += [rank.device_used_all] if rank.device_used_all is not None else []
    return own + (drawn_curves(rank.serving) if rank.serving is not None else [])
