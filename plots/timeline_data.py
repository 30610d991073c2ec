"""What the timeline draws for one process, gathered from the analysis (no drawing here).

``prepare_rank(trace, target)`` runs the analyses once and keeps what a renderer needs, so
``timeline.render_timeline`` never touches a Trace's events itself:

- the curves and the categories of allocated memory (``analysis.curves``, ``analysis.categories``);
- the phases (``analysis.phases.phase_stats``);
- the target and the card (``analysis.target.resolve_target``: the one resolver every output uses);
- the OOM the run died of (``analysis.oom.find_oom``) and the first crossing of the target, read up
  to that OOM (``analysis.crossing``: the one definition report and plot share);
- the non-PyTorch bytes CUPTI saw live (``analysis.non_torch.live_curve``), when the trace holds CUPTI
  records: the timeline splits its non-PyTorch band with it (:func:`cupti_split`: where each part
  runs, in bytes, once the renderer has picked the NVML samples it draws).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis.categories import categorize, category_curves
from ..analysis.crossing import Crossings, Excursion, crossings
from ..analysis.curves import Curve, Curves, all_curves
from ..analysis.fingerprint import describe_run
from ..analysis.live import lifetimes
from ..analysis.non_torch import has_records, live_curve
from ..analysis.oom import Oom, find_oom
from ..analysis.phases import PhaseStats, phase_stats, recording_span
from ..analysis.target import Target, resolve_target
from ..model import Trace
from .downsample import bucket_indices


@dataclass(frozen=True)
class RankTimeline:
    """One process's curves and figures, ready to draw."""

    label: str
    curves: Curves
    categories: dict[str, Curve]
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


def prepare_rank(trace: Trace, target_bytes: int | None = None, *, target: Target | None = None) -> RankTimeline:
    """Run the analyses the timeline needs on ``trace``.

    Args:
        trace: the trace.
        target_bytes: an explicit target (``--target``), resolved with the trace's card.
        target: an already resolved target (``resolve_target(trace, **target_args(args))``); wins over
            ``target_bytes``. Default: the recorded one.
    """
    if target is None:
        target = resolve_target(trace, target_bytes=target_bytes)
    curves = all_curves(trace)
    cats = category_curves(trace, categorize(trace, lifetimes(trace)))
    start, end = recording_span(trace)
    oom = find_oom(trace)
    return RankTimeline(
        label=trace.label,
        curves=curves,
        categories=cats,
        phases=phase_stats(trace, curves),
        start_us=start,
        end_us=max(end, start + 1),
        target=target,
        crossings=crossings(trace, curves, target.target_bytes, oom_us=oom.time_us if oom else None),
        oom=oom,
        device_total_bytes=trace.process.device_total_bytes,
        description=describe_run(trace),
        cupti=live_curve(trace) if has_records(trace) else None,
    )


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
