"""TEST-ONLY: each rank's offset to the driver's clock as recorded, and one line stating it.

The Ray and multi-rank tests check the measured offsets with it; outputs never print this line (they put
the ranks on one clock through ``memtrace.analysis.analysed.origin``, whose sentence they state). Moved out of
``memtrace.analysis.analysed.origin`` (issue 33: no test-only code in the package).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from memtrace import facts as F
from memtrace.analysis.analysed.origin import RankClock, rank_clock
from memtrace.model import Trace


@dataclass(frozen=True)
class DriverClock(RankClock):
    def to_driver_us(self, time_us: int) -> int:
        """``time_us`` of this trace on the driver's clock (unchanged when the offset is unknown)."""
        return time_us + (self.offset_us or 0)


@dataclass(frozen=True)
class Alignment:
    """The run's clocks: one entry per trace (in the given order), the driver's host, and one line."""

    ranks: tuple[DriverClock, ...]
    reference_host: str | None
    aligned: bool  # every rank's offset to the driver's clock is known
    uncertainty_us: int | None  # the largest uncertainty of any rank (None when not aligned)
    statement: str


def _reference_host(traces: Sequence[Trace]) -> str | None:
    for trace in traces:
        fact = trace.facts.get(F.CLOCK)
        if isinstance(fact, dict) and fact.get("reference_host"):
            return str(fact["reference_host"])
    return traces[0].process.hostname if traces else None


def _ms(us: int) -> str:
    return f"{us / 1000:.2f} ms"


def _offset(us: int) -> str:
    return f"{us / 1e6:+.6f} s"


def _statement(ranks: Sequence[RankClock], reference: str | None, aligned: bool, worst: int | None) -> str:
    if not ranks:
        return "no traces"
    shifted = [r for r in ranks if r.method not in ("same-host", "unrecorded")]
    unknown = [r for r in ranks if r.offset_us is None]
    if unknown:
        who = ", ".join(f"{r.label} ({r.host})" for r in unknown)
        return (
            f"not aligned: no measured offset to the driver's clock ({reference}) for {who}; "
            "their times are their own hosts' clocks"
        )
    if not shifted:
        if len(ranks) == 1:
            return f"one trace on {ranks[0].host}: its own clock"
        return f"one clock: all {len(ranks)} traces were recorded on the driver's host ({reference})"
    parts = [
        f"{r.label} {_offset(r.offset_us)} ± {_ms(r.uncertainty_us or 0)} ({r.method}, {r.host})"  # type: ignore[arg-type]
        for r in shifted
    ]
    same = len(ranks) - len(shifted)
    tail = f"; {same} on the driver's host" if same else ""
    return f"aligned to the driver's clock ({reference}) within ± {_ms(worst or 0)}: " + ", ".join(parts) + tail


def alignment(traces: Sequence[Trace]) -> Alignment:
    """Each trace's offset to the driver's clock, with its uncertainty, and the one-line statement every
    multi-rank output prints. Pure: reads the ``clock`` fact and the recording host only."""
    hosts = {t.process.hostname for t in traces}
    ranks = tuple(DriverClock(**asdict(rank_clock(t, same_host_run=len(hosts) <= 1))) for t in traces)
    reference = _reference_host(traces)
    aligned = all(r.offset_us is not None for r in ranks)
    worst = max((r.uncertainty_us or 0 for r in ranks), default=0) if aligned else None
    return Alignment(ranks, reference, aligned, worst, _statement(ranks, reference, aligned, worst))
