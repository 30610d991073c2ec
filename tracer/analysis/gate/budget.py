"""Is a trace's peak within a memory budget? The pure check behind the pytest plugin's marker.

The budget is a target resolved by ``analysis.target.resolve_target`` (the one resolver): an explicit
size, ``util`` x ``total`` (or x the card the run stood for), else the target the trace recorded.
The peak is taken on one curve: ``reserved`` (PyTorch's segments, the default: what the process
holds on the card), ``allocated`` (bytes live in tensors) or ``device`` (NVML device-used: the
whole card, CUDA context and other processes included; needs NVML samples). The figures are
``memtrace report``'s (the analysed run's summary: the same peak, moment, phase and holders, and the OOM
the run died of). A trace that recorded no allocator event is no pass: ``NothingToJudge``.
"""

from __future__ import annotations

from dataclasses import dataclass

from memtrace.analysis.holders.frames import site_frame
from memtrace.analysis.holders.live import holders_by_stack
from memtrace.analysis.memory.oom import Oom
from memtrace.analysis.memory.target import describe
from memtrace.errors import UsageError
from memtrace.model import Frame, Trace

CURVES = ("reserved", "allocated", "device")


@dataclass(frozen=True)
class BudgetHolder:
    """Bytes live at the peak from one allocating stack."""

    bytes: int
    count: int
    frame: Frame | None  # the innermost frame worth showing (outside torch and memtrace)


@dataclass(frozen=True)
class BudgetCheck:
    """The verdict of :func:`check_budget`."""

    budget_bytes: int
    curve: str
    peak_bytes: int
    peak_us: int
    phase: str  # phase path in force at the peak ("" outside every phase)
    holders: list[BudgetHolder]
    budget_source: str = ""  # analysis.target.describe of the resolved target
    peaks: dict[str, int] | None = None  # every curve's peak as `memtrace report` prints it
    oom: Oom | None = None  # the OOM the run died of, if it did

    @property
    def over(self) -> bool:
        return self.peak_bytes > self.budget_bytes

    @property
    def excess_bytes(self) -> int:
        return self.peak_bytes - self.budget_bytes


def check_budget(
    trace: Trace,
    budget_bytes: int | None = None,
    *,
    curve: str = "reserved",
    top: int = 5,
    util: float | None = None,
    total_bytes: int | None = None,
) -> BudgetCheck:
    """Compare the peak of ``curve`` in ``trace`` with the budget, on the trace's analysed run
    (``analysis.run.analyse``: the same target, summary and OOM as ``memtrace report``).

    Args:
        trace: the recorded trace.
        budget_bytes: the largest peak allowed (``--target``); None: ``util`` or the recorded target.
        curve: "reserved" (default), "allocated" or "device" (NVML).
        top: how many holders at the peak to report.
        util: the budget as a share of the card (``--util``), with ``total_bytes`` (``--total``).
    Raises:
        UsageError: an unknown curve, "device" without NVML samples, or no budget at all.
        NothingToJudge: the trace recorded no allocator events (a test that lost its GPU never passes).
    """
    from memtrace.analysis.analysed.rank import TargetSpec
    from memtrace.analysis.analysed.run import analyse
    from memtrace.analysis.analysed.summary import PeakPoint, holders_by_site

    if curve not in CURVES:
        raise UsageError(f"unknown curve {curve!r} for a memory budget; use one of {', '.join(CURVES)}")
    run = analyse([trace], TargetSpec(budget_bytes, util, total_bytes), path=trace.path, top=top)
    rank = run.ranks[0]
    if rank.target.target_bytes is None:
        raise UsageError("no memory budget: give max_peak='30GiB' or util=0.9; the trace recorded no target")
    run.require_every_rank("judge against the budget")
    curves = rank.curves
    if curve == "device" and not curves.has_device:
        raise UsageError("the trace holds no NVML samples, so no device-level peak; budget the 'reserved' curve")
    budget, source = rank.target.target_bytes, describe(rank.target)
    if rank.recorded_nothing:  # died before its first allocation: nothing to show but the OOM
        return BudgetCheck(budget, curve, 0, rank.span[0], "", [], source, {}, rank.oom)
    pr = rank.peak
    points = {"reserved": PeakPoint("reserved", pr.time_us, pr.reserved_bytes, pr.phase_path)}
    points |= {"allocated": rank.peak_allocated, "device": rank.peak_device_used}
    peaks = {k: (p.bytes, p.time_us, p.phase_path) for k, p in points.items() if p is not None}
    peak, peak_us, phase = peaks[curve]
    if curve == "reserved":  # the reserved peak's holders: report's, where the run's headline is that peak
        at = rank.peak.event_index
        lines = rank.holders if rank.headline.event_index == at else holders_by_site(trace, at, top, lt=rank.lifetimes)
        holders = [BudgetHolder(h.bytes, h.count, h.frame) for h in lines]
    else:  # allocated's curve index i is the state after event i - 1
        at = {"event_index": curves.allocated.peak_index - 1} if curve == "allocated" else {"t_us": peak_us}
        hs = holders_by_stack(trace, top=top, lt=rank.lifetimes, **at)
        holders = [BudgetHolder(h.bytes, h.count, site_frame(rank.trace, h.stack)) for h in hs]
    return BudgetCheck(
        budget, curve, peak, peak_us, phase, holders, source, {k: v[0] for k, v in peaks.items()}, rank.oom
    )
