"""What the timeline draws for one process, gathered from the analysis (no drawing here).

``prepare_rank(trace, target)`` runs the analyses once and keeps what a renderer needs, so
``timeline.render_timeline`` never touches a Trace's events itself:

- the curves and the categories of allocated memory (``analysis.curves``, ``analysis.categories``);
- the phases (``analysis.phases.phase_stats``);
- the target and the card (``analysis.target.resolve_target``: the one resolver every output uses);
- the OOM the run died of (``analysis.oom.find_oom``) and the first crossing of the target, read up
  to that OOM (``analysis.crossing``: the one definition report and plot share).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis.categories import categorize, category_curves
from ..analysis.crossing import Crossings, Excursion, crossings
from ..analysis.curves import Curve, Curves, all_curves
from ..analysis.live import lifetimes
from ..analysis.oom import Oom, find_oom
from ..analysis.phases import PhaseStats, phase_stats, recording_span
from ..analysis.target import Target, resolve_target
from ..model import Trace
from .titles import describe_run


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
    )
