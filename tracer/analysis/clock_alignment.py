"""How the ranks of a run line up in time: each rank's offset to the driver's clock, and one line saying so.

Each trace's times are read on its own host's clock. A capture records in the fact ``clock``
(``memtrace.capture.clock``) its host, the driver's host and its offset to the driver's clock:
``same-host`` (offset 0 ± 0), ``ray`` (measured through Ray round trips: ± half the best round trip)
or ``unmeasured``. A time ``t`` of a rank is ``t + offset_us`` on the driver's clock. Traces recorded
before that fact existed (or imported) say nothing: on one host they share its clock; across hosts
their offset is unknown. :func:`alignment` is the one place every multi-rank output gets its time
shift and the sentence stating the alignment; it only reads facts and ``process.hostname``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .. import facts as F
from ..model import Trace


@dataclass(frozen=True)
class RankClock:
    """One trace's clock relative to the driver's: ``driver time = trace time + offset_us``."""

    label: str  # "rank 1", "pid 42"
    rank: int | None
    host: str
    method: str  # "same-host", "ray", "unmeasured", or "unrecorded" (no clock fact in the trace)
    offset_us: int | None  # None: unknown
    uncertainty_us: int | None

    def to_driver_us(self, time_us: int) -> int:
        """``time_us`` of this trace on the driver's clock (unchanged when the offset is unknown)."""
        return time_us + (self.offset_us or 0)


@dataclass(frozen=True)
class Alignment:
    """The run's clocks: one entry per trace (in the given order), the driver's host, and one line."""

    ranks: tuple[RankClock, ...]
    reference_host: str | None
    aligned: bool  # every rank's offset to the driver's clock is known
    uncertainty_us: int | None  # the largest uncertainty of any rank (None when not aligned)
    statement: str


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def rank_clock(trace: Trace, same_host_run: bool = True) -> RankClock:
    """The clock of one trace; ``same_host_run`` says whether every trace of its run names one host
    (then a trace without a clock fact shares the driver's clock)."""
    fact = trace.facts.get(F.CLOCK)
    host = trace.process.hostname
    if isinstance(fact, dict):
        host = str(fact.get("host") or host)
        return RankClock(
            trace.label,
            trace.process.rank,
            host,
            str(fact.get("method") or "unmeasured"),
            _int(fact.get("offset_us")),
            _int(fact.get("uncertainty_us")),
        )
    known = 0 if same_host_run else None
    return RankClock(trace.label, trace.process.rank, host, "unrecorded", known, known)


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
    ranks = tuple(rank_clock(t, same_host_run=len(hosts) <= 1) for t in traces)
    reference = _reference_host(traces)
    aligned = all(r.offset_us is not None for r in ranks)
    worst = max((r.uncertainty_us or 0 for r in ranks), default=0) if aligned else None
    return Alignment(ranks, reference, aligned, worst, _statement(ranks, reference, aligned, worst))
