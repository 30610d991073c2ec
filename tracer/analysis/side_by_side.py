"""Ranks side by side: per rank its reserved peak, when and in which phase; how much more the top rank
peaked than the next one, and which rank peaked first (the "extra 3 GB on GPU0" question of a
tensor-parallel run). Read by the report, its JSON and the view; one rank gives nothing to compare.
"""

from __future__ import annotations

from dataclasses import dataclass

from .run import AnalysedRun


@dataclass(frozen=True)
class RankPeak:
    """One rank's reserved peak, on the run's clock."""

    label: str
    peak_reserved_bytes: int
    time_us: int
    phase_path: str
    verdict: str


@dataclass(frozen=True)
class SideBySide:
    """Every rank with allocator events, by peak (highest first), and the comparisons."""

    rows: list[RankPeak]
    top: str  # the label of the rank with the highest peak
    top_excess_bytes: int  # its peak minus the next highest rank's
    first: str  # the rank whose peak came first
    first_us: int


def side_by_side(run: AnalysedRun) -> SideBySide | None:
    """The comparison of the run's ranks (None for fewer than two ranks with allocator events)."""
    ranks = run.with_events()
    if len(ranks) < 2:
        return None
    rows = []
    for r in ranks:
        p = r.summary.peak
        rows.append(RankPeak(r.label, p.reserved_bytes, p.time_us, p.phase_path, r.verdict))
    rows.sort(key=lambda x: (-x.peak_reserved_bytes, x.time_us))
    first = min(rows, key=lambda x: x.time_us)
    return SideBySide(
        rows, rows[0].label, rows[0].peak_reserved_bytes - rows[1].peak_reserved_bytes, first.label, first.time_us
    )
