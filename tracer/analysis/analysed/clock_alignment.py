"""How the ranks of a run line up in time: each rank's offset to the driver's clock, and one line saying so.

Each trace's times are read on its own host's clock. A capture records in the fact ``clock``
(``memtrace.capture.clock``) its host, the driver's host and its offset to the driver's clock:
``same-host`` (offset 0 ± 0), ``ray`` (measured through Ray round trips: ± half the best round trip)
or ``unmeasured``. A time ``t`` of a rank is ``t + offset_us`` on the driver's clock. Traces recorded
before that fact existed (or imported) say nothing: on one host they share its clock; across hosts
their offset is unknown. :func:`rank_clock` reads one trace's clock (facts and ``process.hostname``
only); ``analysis.origin`` shifts the ranks by it and words the sentence every multi-rank output prints.
"""

from __future__ import annotations

from dataclasses import dataclass

from memtrace import facts as F
from memtrace.model import Trace


@dataclass(frozen=True)
class RankClock:
    """One trace's clock relative to the driver's: ``driver time = trace time + offset_us``."""

    label: str  # "rank 1", "pid 42"
    rank: int | None
    host: str
    method: str  # "same-host", "ray", "unmeasured", or "unrecorded" (no clock fact in the trace)
    offset_us: int | None  # None: unknown
    uncertainty_us: int | None


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
