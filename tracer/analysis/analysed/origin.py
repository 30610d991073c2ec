"""One time origin for every output of a run, the ranks put on one clock, and the sentence that says both.

Every output of a run counts seconds from :attr:`TimeOrigin.t0_us`: the earliest moment any rank knows about
(``phases.recording_span``), on the driver's clock. Before that, a trace recorded on another host is shifted by
the offset its capture recorded in the fact ``clock`` (:func:`rank_clock`: ``same-host``, ``ray`` measured
through Ray round trips, or ``unmeasured``; driver time = trace time + offset), its uncertainty kept; a trace on
the driver's node shares its clock and is not moved. The sentence (:attr:`TimeOrigin.sentence`) states both,
e.g. "0 s = rank 0's recording start (2026-12-03 08:21:21.823 UTC); ranks 0-1 on the driver's clock (vm);
rank 1 shifted by −3.999918 s ± 0.48 ms (measured at start through Ray)".
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memtrace import facts as F
from memtrace.analysis.memory.phases import recording_span
from memtrace.model import Trace

#: Facts holding Unix-epoch microseconds of the trace's own clock at the top level (moved with the trace).
_TIME_FACTS = (F.PEAK_STATS_RESET_US, F.VLLM_STARTUP_COMPLETE_US, F.PEAK_RESETS_US)
_METHODS = {"ray": "measured at start through Ray", "unmeasured": "not measured", "unrecorded": "not recorded"}


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
    fact, p = trace.facts.get(F.CLOCK), trace.process
    if not isinstance(fact, dict):
        known = 0 if same_host_run else None
        return RankClock(trace.label, p.rank, p.hostname, "unrecorded", known, known)
    host, method = str(fact.get("host") or p.hostname), str(fact.get("method") or "unmeasured")
    return RankClock(trace.label, p.rank, host, method, _int(fact.get("offset_us")), _int(fact.get("uncertainty_us")))


@dataclass(frozen=True)
class Shift:
    """How one trace was put on the driver's clock: ``shift_us`` added to its times (0: not moved)."""

    label: str
    shift_us: int
    uncertainty_us: int
    method: str  # "driver" (on the driver's node or host), "ray", "unmeasured", "unrecorded"
    host: str


@dataclass(frozen=True)
class TimeOrigin:
    """The moment every output counts from (driver's clock), each trace's shift, and the sentence."""

    t0_us: int
    shifts: tuple[Shift, ...]
    aligned: bool  # every trace is on the driver's clock (moved by a measured offset, or already on it)
    sentence: str

    def seconds(self, t_us: int) -> float:
        """``t_us`` (Unix-epoch µs, driver's clock) as seconds since the origin."""
        return (t_us - self.t0_us) / 1e6


def _on_driver_node(trace: Trace, clock: RankClock) -> bool:
    if clock.method == "same-host":
        return True
    if clock.method == "unrecorded":  # no clock fact: on the driver's clock when the run has one host
        return clock.offset_us == 0
    fact, ray = trace.facts.get(F.CLOCK), trace.facts.get(F.RAY)
    if clock.method == "ray" and isinstance(fact, dict) and isinstance(ray, dict) and fact.get("reference_node_id"):
        return ray.get("node_id") == fact.get("reference_node_id")
    return False


def shifts(traces: Sequence[Trace]) -> tuple[Shift, ...]:
    """The shift of each trace onto the driver's clock (see the module docstring)."""
    hosts = {t.process.hostname for t in traces}
    out = []
    for t in traces:
        c = rank_clock(t, same_host_run=len(hosts) <= 1)
        if _on_driver_node(t, c):
            out.append(Shift(t.label, 0, 0, "driver", c.host))
        elif c.offset_us is not None:
            out.append(Shift(t.label, int(c.offset_us), int(c.uncertainty_us or 0), c.method, c.host))
        else:
            out.append(Shift(t.label, 0, 0, c.method, c.host))
    return tuple(out)


def _shift_facts(value: Any, by: int, top: bool = False) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "time_us" and isinstance(v, int) and not isinstance(v, bool):
                out[k] = v + by
            elif top and k in _TIME_FACTS:
                out[k] = [x + by for x in v] if isinstance(v, list) else (v + by if isinstance(v, int) else v)
            elif top and k == F.CLOCK:
                out[k] = v  # the measurement itself, as recorded
            else:
                out[k] = _shift_facts(v, by)
        return out
    if isinstance(value, list):
        return [_shift_facts(v, by) for v in value]
    return value


def shifted(trace: Trace, by_us: int) -> Trace:
    """A copy of ``trace`` with every time moved by ``by_us`` (the input is left as it was); ``trace``
    itself when ``by_us`` is 0. The serving window's records and edges move too: ``serving.joined`` puts them on
    the rank's one timeline."""
    if not by_us:
        return trace
    w, edges = trace.window, "start_us end_us"
    window = None
    if w is not None:
        steps = {k: getattr(w, k) for k in ("steps", "steps_in_progress")}
        steps = {k: None if v is None else [_step_at(st, by_us) for st in v] for k, v in steps.items()}
        window = _moved(w, by_us, "events samples others", f"startup_end_us {edges}", **steps)
    return _moved(
        trace,
        by_us,
        "events samples others device_allocs vmm",
        recording=_moved(trace.recording, by_us, edges=edges),
        phases=[_moved(p, by_us, edges=edges) for p in trace.phases],
        hook_calls=[_moved(c, by_us, edges=edges) for c in trace.hook_calls],
        notes=[_moved(n, by_us, edges="time_us") for n in trace.notes],
        facts=_shift_facts(trace.facts, by_us, top=True),
        window=window,
    )


def _moved(obj: Any, by_us: int, arrays: str = "", edges: str = "", **more: Any) -> Any:
    """``obj`` (a dataclass) with the records of its ``arrays`` and its (optional) microseconds ``edges`` moved by
    ``by_us``, and ``more`` replaced."""
    new = {k: None if getattr(obj, k) is None else getattr(obj, k) + by_us for k in edges.split()}
    for k in arrays.split():
        new[k] = getattr(obj, k).copy()
        new[k]["time_us"] += by_us
    return dataclasses.replace(obj, **new, **more)


def _step_at(step: dict, by_us: int) -> dict:
    return {**step, "time_us": step["time_us"] + by_us} if step.get("time_us") is not None else step


def who(labels: Sequence[str]) -> str:
    """``rank 0``, ``ranks 0-3``, ``ranks 0, 2``, ``pids 457, 552``: labels of a run in few words."""
    ranks = [int(x.split()[1]) for x in labels if x.startswith("rank ")]
    if len(labels) == 1:
        return labels[0]
    if len(ranks) == len(labels):
        ranks.sort()
        if ranks == list(range(ranks[0], ranks[0] + len(ranks))):
            return f"ranks {ranks[0]}-{ranks[-1]}"
        return "ranks " + ", ".join(map(str, ranks))
    if all(x.startswith("pid ") for x in labels):
        return "pids " + ", ".join(x.split()[1] for x in labels)
    return ", ".join(labels)


def _when(t_us: int) -> str:
    d = _dt.datetime.fromtimestamp(t_us / 1e6, tz=_dt.timezone.utc)
    return d.strftime("%Y-%m-%d %H:%M:%S.") + f"{d.microsecond // 1000:03d} UTC"


def _clock_words(sh: Sequence[Shift]) -> str:
    labels = [s.label for s in sh]
    unknown = [s for s in sh if s.method in ("unmeasured", "unrecorded")]
    moved = [s for s in sh if s.shift_us]
    hosts = sorted({s.host for s in sh if s.host})
    if unknown and len(hosts) > 1:
        names = ", ".join(f"{s.label} ({s.host}, offset {_METHODS[s.method]})" for s in unknown)
        return f"NOT aligned: {names} on their own hosts' clocks"
    if not moved:
        host = f" ({hosts[0]})" if len(hosts) == 1 else ""
        return f"{who(labels)} on one clock{host}"
    ref = f" ({hosts[0]})" if len(hosts) == 1 else ""
    parts = [
        f"{s.label} shifted by {_signed_s(s.shift_us)} ± {s.uncertainty_us / 1000:.2f} ms "
        f"({_METHODS.get(s.method, s.method)})"
        for s in moved
    ]
    return f"{who(labels)} on the driver's clock{ref}; " + ", ".join(parts)


def _signed_s(us: int) -> str:
    return ("−" if us < 0 else "+") + f"{abs(us) / 1e6:.6f} s"


def time_origin(traces: Sequence[Trace], sh: Sequence[Shift]) -> TimeOrigin:
    """The run's origin over ``traces`` (already shifted by ``sh``), with its sentence."""
    if not traces:
        return TimeOrigin(0, (), True, "no traces")
    starts = [recording_span(t)[0] for t in traces]
    first = min(range(len(traces)), key=lambda i: starts[i])
    t0 = starts[first]
    whose = "the recording's start" if len(traces) == 1 else f"{traces[first].label}'s recording start"
    aligned = not any(s.method in ("unmeasured", "unrecorded") for s in sh) or len({s.host for s in sh}) <= 1
    clockless = all((t.facts.get(F.IMPORT) or {}).get("clock") in ("synthetic", "none") for t in traces)
    sentence = f"0 s = {whose} ({'no wall-clock time recorded' if clockless else _when(t0)})"
    if len(traces) > 1:
        sentence += f"; {_clock_words(sh)}"
    return TimeOrigin(t0, tuple(sh), aligned, sentence)
