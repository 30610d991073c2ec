"""Ranks side by side: per rank its peak of the quantity the run's ranks are compared by
(``AnalysedRun.ranked_by``: PyTorch reserved, or PyTorch allocated for the CPU's traces), when and in which
phase; how much more the top rank peaked than the next one, or which ranks peaked equally, and which rank
peaked first (the "extra 3 GB on GPU0" question of a tensor-parallel run). Read by the report, its JSON and
the view; one rank gives nothing to compare.
"""

from __future__ import annotations

from dataclasses import dataclass

from memtrace.analysis.analysed.run import AnalysedRun
from memtrace.analysis.memory.quantities import ranked_by


@dataclass(frozen=True)
class RankPeak:
    """One rank's peak of the compared quantity (``SideBySide.quantity``), on the run's clock."""

    label: str
    peak_bytes: int
    time_us: int
    phase_path: str
    verdict: str


@dataclass(frozen=True)
class SideBySide:
    """Every rank with allocator events whose peak compares with the others', by peak (highest first), and the
    comparisons."""

    quantity: str  # the key of the quantity compared (``quantities.ranked_by``): "reserved" or "allocated"
    rows: list[RankPeak]
    top: str  # the label of the rank with the highest peak
    top_ranks: list[str]  # every rank at the highest peak: the top alone, or the ranks that peaked equally
    top_excess_bytes: int  # its peak minus the next highest rank's (0 when ranks peaked equally)
    first: str  # the rank whose peak came first
    first_us: int


def side_by_side(run: AnalysedRun) -> SideBySide | None:
    """The comparison of the run's ranks (None for fewer than two ranks with allocator events whose memory is
    of the kind compared: the CPU's trace beside GPU workers is not one of them)."""
    q = run.ranked_by
    ranks = [r for r in run.with_events() if ranked_by(r.trace.process) is q]
    if len(ranks) < 2:
        return None
    rows = [
        RankPeak(r.label, r.ranked_peak.bytes, r.ranked_peak.time_us, r.ranked_peak.phase_path, r.verdict)
        for r in ranks
    ]
    rows.sort(key=lambda x: (-x.peak_bytes, x.time_us))
    first = min(rows, key=lambda x: x.time_us)
    top = [x.label for x in rows if x.peak_bytes == rows[0].peak_bytes]
    return SideBySide(
        q.key, rows, rows[0].label, top, rows[0].peak_bytes - rows[1].peak_bytes, first.label, first.time_us
    )
