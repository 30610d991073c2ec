"""The analysed run: built once from the loaded traces and the target specification, read by every output.

``analyse(traces, spec)`` checks that the traces are one run (a folder holding two runs is refused, never
merged: :func:`separate_runs`), puts every trace on the driver's clock (``analysis.origin``), fixes one time
origin for all ranks, and wraps each trace in an ``analysis.rank.AnalysedRank`` (whose figures are computed
lazily, once). For the run it answers:

- **worst rank** (:attr:`AnalysedRun.worst`): a rank that died (the first to die), else the largest
  overshoot of its target, else the highest peak of the quantity the run's ranks are compared by
  (:attr:`AnalysedRun.ranked_by`: reserved, or allocated for the CPU's traces); a rank that recorded nothing
  is never worse than one that recorded something. Every output names this one.
- **verdict** (:attr:`AnalysedRun.verdict`): the worst rank's (died, crossed, within target, no target),
  or "recorded nothing" when no rank recorded an allocator event: a gate never passes such a run
  (:meth:`AnalysedRun.require_events`).
- **ranks side by side** (:func:`side_by_side`): each rank's peak of the quantity compared, how much more the top
  rank peaked than the next (or which peaked equally), and which peaked first (the "extra 3 GB on GPU0" question).
- **missing ranks**: traces ``nodes.json`` lists that are not in the run directory (still on their node,
  or their hand-over failed), with how to fetch them (given by the loader: analysis reads no files).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from memtrace.analysis.analysed.origin import TimeOrigin, shifted, shifts, time_origin, who
from memtrace.analysis.analysed.rank import AnalysedRank, TargetSpec
from memtrace.analysis.analysed.verdict import NOTHING
from memtrace.analysis.memory.phases import recording_span
from memtrace.analysis.memory.quantities import ALLOCATED, MEMORY_OF_ROLE, RESERVED, Quantity, on_a_card, ranked_by
from memtrace.errors import NothingToJudge, SeparateRuns, UsageError
from memtrace.model import Trace


@dataclass(frozen=True)
class MissingRank:
    """A trace of the run that is not in its directory (``nodes.json``): where it is and how to fetch it."""

    file: str
    rank: int | None
    host: str
    status: str  # "on-node" (not handed over yet) or "failed" (the hand-over failed)
    error: str | None
    fetch: str  # the command that fetches it

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else self.file

    @property
    def line(self) -> str:
        """``MISSING: rank 1 (b-pid7-rank1.memtrace) is still on host b (...); fetch it with: scp ...``"""
        if self.status == "failed":
            why = f"could not be handed over ({self.error or 'no reason recorded'}); it is on host {self.host}"
        elif self.status == "on-node":
            why = f"is still on host {self.host} (not handed over yet)"
        else:  # nodes.json says it arrived, yet the run directory lacks it
            why = f"is not in the run directory (nodes.json: {self.status}); its node's copy is on host {self.host}"
        return f"MISSING: {self.label} ({self.file}) {why}; fetch it with: {self.fetch}"


class AnalysedRun:
    """One run, analysed: its ranks (``ranks``, in the loader's order), one time origin, one worst rank,
    one verdict (see the module docstring)."""

    def __init__(
        self, path: str, ranks: list[AnalysedRank], origin: TimeOrigin, missing: Sequence[MissingRank] = ()
    ) -> None:
        self.path = path
        self.ranks = ranks
        self.origin = origin
        self.missing = list(missing)
        #: answers of the layers above to questions about this run (``gate.diff.compared``), each computed once
        self.memo: dict[tuple, Any] = {}

    def __repr__(self) -> str:
        return f"AnalysedRun({self.path!r}, {len(self.ranks)} rank(s), {self.verdict})"

    @property
    def traces(self) -> list[Trace]:
        return [r.trace for r in self.ranks]

    @property
    def multi(self) -> bool:
        return len(self.ranks) > 1

    @cached_property
    def worst(self) -> AnalysedRank:
        """The rank every output names as the worst (see the module docstring); a run of one rank computes
        nothing to say so."""
        return self.ranks[0] if len(self.ranks) == 1 else min(self.ranks, key=lambda r: _worst_key(r, self.ranked_by))

    @cached_property
    def ranked_by(self) -> Quantity:
        """The quantity the run's ranks are compared by (``quantities.ranked_by``): PyTorch reserved when a rank
        with events holds it, else PyTorch allocated (every trace the CPU's). A rank of the other kind (the
        CPU's trace beside GPU workers) is not compared with them."""
        kinds = {ranked_by(r.trace.process) for r in self.with_events()}
        return ALLOCATED if kinds == {ALLOCATED} else RESERVED

    @property
    def verdict(self) -> str:
        """The run's verdict: the worst rank's, or "recorded nothing" when no rank recorded an event."""
        if all(r.recorded_nothing for r in self.ranks) and not any(r.oom for r in self.ranks):
            return NOTHING
        return self.worst.verdict

    @property
    def died(self) -> bool:
        return any(r.oom is not None for r in self.ranks)

    def subset(self, ranks: list[AnalysedRank]) -> AnalysedRun:
        """The same run (origin, missing ranks) showing only ``ranks``."""
        return AnalysedRun(self.path, ranks, self.origin, self.missing)

    def with_events(self) -> list[AnalysedRank]:
        """The ranks that recorded allocator events."""
        return [r for r in self.ranks if not r.recorded_nothing]

    def require_events(self, what: str) -> list[AnalysedRank]:
        """The ranks with allocator events; NothingToJudge (exit 1) when none recorded any."""
        kept = self.with_events()
        if not kept:
            raise NothingToJudge(nothing_line(self, what))
        return kept

    def require_every_rank(self, what: str) -> None:
        """NothingToJudge (exit 1) naming the ranks that recorded no allocator events and did not die: such a run
        is never a reference, and never passes."""
        empty = [r for r in self.ranks if r.recorded_nothing and r.oom is None]
        if empty:
            raise NothingToJudge(nothing_line(self.subset(empty), what))

    def on_cards(self, what: str) -> AnalysedRun:
        """The run with only its ranks of a GPU's memory (``quantities.on_a_card``: what a card holds); a
        UsageError (one line, exit 2) when it has none: a card is a GPU's, so the CPU's memory cannot ``what``."""
        kept = [r for r in self.ranks if on_a_card(r.trace.process)]
        if kept:
            return self if len(kept) == len(self.ranks) else self.subset(kept)
        names = who([r.label for r in self.ranks])
        kinds = " and ".join(dict.fromkeys(MEMORY_OF_ROLE[r.trace.process.role] for r in self.ranks))
        raise UsageError(
            f"{self.path}: {names} hold{'s' if len(self.ranks) == 1 else ''} {kinds} only, not a GPU's, so there "
            f"is nothing to {what} on a GPU card; record a GPU worker (memtrace run, or vLLM's profiler on a GPU)"
        )


def nothing_line(run: AnalysedRun, what: str) -> str:
    """The one line of the "recorded nothing" verdict."""
    names = who([r.label for r in run.ranks])
    return (
        f"{run.path}: {names} recorded no allocator events, so there is nothing to {what} "
        "(a CPU-only worker, a job that lost its GPU, or recording never started): not passed"
    )


def _worst_key(r: AnalysedRank, q: Quantity) -> tuple:
    if r.oom is not None:
        return (0, r.oom.time_us, 0)
    if r.recorded_nothing:
        return (3, 0, 0)
    over = r.overshoot_bytes
    if over is not None:
        return (1, -over, 0)
    if ranked_by(r.trace.process) is not q:  # another kind of memory: after every rank compared by q
        return (2, 1, 0)
    return (2, -r.ranked_peak.bytes, 0)


def separate_runs(path: str, traces: Sequence[Trace]) -> None:
    """Refuse a folder whose traces belong to more than one run: one rank (or one host and pid) twice, or
    processes without ranks whose recordings do not overlap (two single-process start-ups copied into one
    folder: nothing ties them into one run, and no clock says they were one).

    Raises SeparateRuns naming both runs' files (split by recording time) and how to split them.
    """
    seen: dict[tuple, Trace] = {}
    twice = None
    for t in traces:
        key = ("rank", t.process.rank) if t.process.rank is not None else ("pid", t.process.hostname, t.process.pid)
        if key in seen:
            twice = (seen[key], t)
            break
        seen[key] = t
    groups = _by_time(traces) if len(traces) > 1 else []
    if twice is not None:
        why = f"{twice[0].label} twice"
        if len(groups) < 2:  # both at once: split by which of the two each duplicate is
            groups = [[twice[0]], [twice[1]]]
    elif len(groups) > 1 and all(t.process.rank is None for t in traces):
        why = "processes without ranks whose recordings do not overlap"
    else:
        return
    a, b = groups[0], groups[1]
    gap = (recording_span(b[0])[0] - max(recording_span(t)[1] for t in a)) / 1e6
    files = [" ".join(dict.fromkeys(_file(t) for t in g)) for g in (a, b)]  # a file may hold several traces
    more = f" (and {len(groups) - 2} more)" if len(groups) > 2 else ""
    raise SeparateRuns(
        f"{path} holds two separate runs ({why}): {files[0]} and, {gap:,.0f} s later, {files[1]}{more}; "
        f"move one run's files into a folder of its own (mkdir {path}-2 && mv {' '.join(dict.fromkeys(_file(t, path) for t in b))} "
        f"{path}-2/) and read each folder on its own"
    )


def _file(t: Trace, folder: str | None = None) -> str:
    name = t.path.rsplit("/", 1)[-1] if t.path else t.label
    return f"{folder.rstrip('/')}/{name}" if folder else name


def _by_time(traces: Sequence[Trace]) -> list[list[Trace]]:
    """Traces grouped by overlapping recording spans, earliest first."""
    spans = sorted(((recording_span(t), t) for t in traces), key=lambda x: x[0][0])
    groups: list[list[Trace]] = []
    end = None
    for (lo, hi), t in spans:
        if end is None or lo > end:
            groups.append([])
        groups[-1].append(t)
        end = hi if end is None else max(end, hi)
    return groups


def analyse(
    traces: Sequence[Trace],
    spec: TargetSpec | None = None,
    *,
    path: str = "",
    missing: Sequence[MissingRank] = (),
    top: int = 10,
) -> AnalysedRun:
    """The analysed run of ``traces`` (one run, in the loader's order) under ``spec`` (default: the recorded
    target). Resolves every rank's target at once (a bad ``--util`` is a UsageError here, before any
    output); everything else is computed when first asked for.

    Raises:
        SeparateRuns: the traces belong to more than one run.
        UsageError: a target the traces cannot give.
    """
    spec = spec or TargetSpec()
    separate_runs(path, traces)
    sh = shifts(traces)
    on_clock = [shifted(t, s.shift_us) for t, s in zip(traces, sh, strict=True)]
    origin = time_origin(on_clock, sh)
    ranks = [AnalysedRank(t, spec, origin, top=top) for t in on_clock]
    return AnalysedRun(path, ranks, origin, missing)


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
