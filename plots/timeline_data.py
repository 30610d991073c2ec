"""What the timeline draws for one process, gathered from the analysis (no drawing here).

``prepare_rank(trace)`` runs the analyses once (curves, categories, summary) and keeps the results
a renderer needs, so ``timeline.render_timeline`` never touches a Trace's events itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis.categories import categorize, category_curves
from ..analysis.curves import Curve, Curves, all_curves
from ..analysis.live import lifetimes
from ..analysis.phases import recording_span
from ..analysis.summary import Crossing, Summary, summarize
from ..model import FACT_UTIL, Trace


@dataclass(frozen=True)
class RankTimeline:
    """One process's curves and figures, ready to draw."""

    label: str
    curves: Curves
    categories: dict[str, Curve]
    summary: Summary
    start_us: int
    end_us: int
    capacity_bytes: int | None  # the card's memory: facts["capacity_bytes"] (a run that stood for a
    # smaller card, e.g. with a per-process memory fraction), else the device's physical memory
    util: float | None  # --gpu-memory-utilization, when recorded

    @property
    def target_bytes(self) -> int | None:
        return self.summary.target_bytes

    def first_crossing(self) -> Crossing | None:
        """The earliest crossing of the target (NVML device-used or PyTorch reserved); on a tie, the
        exact one (reserved)."""
        if not self.summary.crossings:
            return None
        return min(self.summary.crossings, key=lambda c: (c.time_us, c.curve != "reserved"))


def card_capacity(trace: Trace) -> int | None:
    """The card's memory: facts["capacity_bytes"] (a run standing for a smaller card), else the device's."""
    stood_for = trace.facts.get("capacity_bytes")
    if isinstance(stood_for, (int, float)) and stood_for > 0:
        return int(stood_for)
    return trace.process.device_total_bytes


def prepare_rank(trace: Trace, target_bytes: int | None = None) -> RankTimeline:
    """Run the analyses the timeline needs on ``trace`` (``target_bytes`` overrides the recorded one)."""
    curves = all_curves(trace)
    summary = summarize(trace, target_bytes, curves=curves, top=5)
    cats = category_curves(trace, categorize(trace, lifetimes(trace)))
    start, end = recording_span(trace)
    util = trace.facts.get(FACT_UTIL)
    return RankTimeline(
        label=trace.label,
        curves=curves,
        categories=cats,
        summary=summary,
        start_us=start,
        end_us=max(end, start + 1),
        capacity_bytes=card_capacity(trace),
        util=float(util) if util is not None else None,
    )
