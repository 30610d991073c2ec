"""Which moment (and which window) a "what was live" view shows: ``--at`` and ``--since`` read once.

``--at`` picks the moment:

- ``peak``: the run's peak (``AnalysedRank.headline``, :func:`peak_moment`): what the process held on a run
  with vLLM 0.34's KV cache outside PyTorch, else the peak of reserved memory, at its fullest
  (``quantities.fullest_at_peak``), or allocated's for the CPU's trace;
- ``oom``: right before the failed allocation the run died of (``analysis.oom.find_oom``);
- a time since the start of the recording: ``7.05``, ``7.05s``, ``7050ms``, ``7050000us`` (or ``µs``);
- a phase, by name or path: the fullest moment (most bytes allocated) of that phase; a name that
  occurs several times picks the occurrence with the highest peak.

``--since`` keeps only what was allocated at or after a moment (a phase's start, or a time): the
flame then shows what that window *added and still held*. ``--added`` is ``--since`` the phase the
moment lies in: the phase named by ``--at``, else the innermost phase in force at that moment.
Every unreadable value is a UsageError naming what is accepted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from memtrace import facts as F
from memtrace.analysis.memory.curves import Curves
from memtrace.analysis.memory.oom import find_oom
from memtrace.analysis.memory.phases import PhaseStats, path_at, phase_path, phase_stats, recording_span
from memtrace.analysis.memory.quantities import holds_reserved, window_fullest
from memtrace.errors import UsageError
from memtrace.model import Trace

_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(s|ms|us|µs)?\s*$", re.IGNORECASE)
_UNIT_US = {"s": 1_000_000, "ms": 1_000, "us": 1, "µs": 1, None: 1_000_000}

#: What ``--at peak`` is called in titles and lines: the peak of PyTorch's reserved memory (from vLLM 0.34 the
#: KV cache is committed outside PyTorch later, so it is not the most the process held).
PEAK = "the reserved peak"
#: What ``--at peak`` is called where the run's headline is what the process held (``AnalysedRank.headline``: vLLM
#: 0.34's KV cache committed outside PyTorch counts): the moment that held the most.
HELD_PEAK = "the peak held (PyTorch reserved + the KV cache outside it)"
#: What ``--at peak`` is called on a trace without reserved memory (the CPU's from torch.profiler): its reserved
#: curve stays 0, so the state shown is allocated's peak (``quantities.fullest_at_peak`` over the whole trace).
ALLOCATED_PEAK = "the allocated peak"
#: What ``--at peak`` is called on a snapshot of allocator state alone (``facts["import"]["state"] == "moment"``).
SNAPSHOT_MOMENT = "the snapshot's one moment (allocator state, no history)"


@dataclass(frozen=True)
class Moment:
    """The state a view shows: right after ``event_index`` (when set), else at ``time_us``."""

    time_us: int
    event_index: int | None
    what: str  # "the reserved peak", "the OOM", "18.250 s", "the fullest moment of profile_run"
    phase_path: str  # the innermost phase in force ("" outside any)
    since_us: int | None = None  # only allocations made at or after this moment count
    since_what: str = ""  # "profile_run's start", "12.000 s"


def peak_words(process) -> str:
    """What ``--at peak`` is called for a trace of ``process`` (``model.Process``): :data:`PEAK`, or
    :data:`ALLOCATED_PEAK` for a trace without reserved memory (``quantities.holds_reserved``)."""
    return PEAK if holds_reserved(process) else ALLOCATED_PEAK


def headline_words(headline, process) -> str:
    """What ``--at peak`` is called for a rank's ``headline`` (``AnalysedRank.headline``) on a trace of ``process``:
    :data:`HELD_PEAK` where it is the peak held, else :func:`peak_words`."""
    return HELD_PEAK if headline.event_index is None else peak_words(process)


def parse_time_us(text: str) -> int | None:
    """Microseconds from ``7.05``, ``7.05s``, ``7050ms``, ``7050us``; None when ``text`` is not a time."""
    m = _TIME.match(text)
    value = float(m.group(1)) * _UNIT_US[m.group(2).lower() if m.group(2) else None] if m else math.nan
    return round(value) if math.isfinite(value) else None


def _phase_choices(trace: Trace) -> str:
    names = sorted({phase_path(trace, i) for i in range(len(trace.phases))})
    return ", ".join(names[:12]) + (" ..." if len(names) > 12 else "") if names else "none recorded"


def find_phase(trace: Trace, curves: Curves, text: str, flag: str) -> PhaseStats:
    """The phase named ``text`` (name or path; the occurrence with the highest peak); UsageError if none."""
    matches = [s for s in phase_stats(trace, curves) if text in (s.name, s.path)]
    if not matches:
        raise UsageError(f"{flag} {text}: no such phase or time; use peak, oom, 7.05s / 7050ms, or one of: "
                         f"{_phase_choices(trace)}")  # fmt: skip
    return max(matches, key=lambda s: (s.peak_allocated_bytes, -s.start_us))


def _at_time(trace: Trace, us: int, flag: str, text: str, t0_us: int | None = None) -> int:
    start, end = recording_span(trace)
    t0 = start if t0_us is None else t0_us
    t = t0 + us
    if not start <= t <= end and t0 == start:
        raise UsageError(f"{flag} {text}: the run lasts {(end - start) / 1e6:.3f} s; give a time from 0 to that")
    if not start <= t <= end:  # a rank that started after the run's origin
        raise UsageError(
            f"{flag} {text}: this rank's recording runs from {(start - t0) / 1e6:.3f} s to {(end - t0) / 1e6:.3f} s; "
            "give a time in between"
        )
    return t


def peak_moment(rank) -> Moment:
    """What ``--at peak`` shows of an analysed rank: its headline peak (``AnalysedRank.headline``), read where the
    rank decided it: right after its event, or (the peak held) every event at its microsecond."""
    h, trace = rank.headline, rank.trace
    only = (trace.facts.get(F.IMPORT) or {}).get("state") == "moment"
    what = SNAPSHOT_MOMENT if only else headline_words(h, trace.process)
    if h.event_index is None:
        return Moment(h.point.time_us, None, what, h.point.phase_path)
    k = h.event_index
    t = int(trace.events["time_us"][k]) if k >= 0 else recording_span(trace)[0]
    return Moment(t, k, what, path_at(trace, t))


def resolve_moment(trace: Trace, curves: Curves, at: str, *, t0_us: int | None = None) -> Moment:
    """Read ``--at`` other than ``peak`` (:func:`peak_moment`; see the module docstring) for ``trace``; a time
    counts from ``t0_us`` (the run's origin, ``analysis.origin``; default: the trace's own start)."""
    text = at.strip()
    if text.lower() == "oom":
        oom = find_oom(trace)
        if oom is None:
            raise UsageError(f"--at oom: {trace.label} recorded no out-of-memory error; use peak, a time or a phase")
        return Moment(oom.time_us, None, "the OOM", oom.phase_path)
    us = parse_time_us(text)
    if us is not None:
        t = _at_time(trace, us, "--at", at, t0_us)
        return Moment(t, None, f"{seconds_text(us)} s", path_at(trace, t))
    best = find_phase(trace, curves, text, "--at")
    k = window_fullest(curves.allocated, best.start_us, best.end_us) - 1
    t = int(trace.events["time_us"][k]) if k >= 0 else recording_span(trace)[0]
    return Moment(max(t, best.start_us), k, f"the fullest moment of {best.path}", best.path)


def with_since(
    trace: Trace, curves: Curves, moment: Moment, since: str | None, added: bool, *, t0_us: int | None = None
) -> Moment:
    """``moment`` restricted to what was allocated from ``--since`` (or, with ``added``, from the start of
    its phase) on; UsageError when both are given, the window is empty, or it starts after the moment."""
    if since is None and not added:
        return moment
    if since is not None and added:
        raise UsageError("give either --added or --since, not both")
    if added and not moment.phase_path:
        raise UsageError(f"--added: {moment.what} lies outside every phase; give --since PHASE|TIME")
    us = None if added else parse_time_us(since)
    if us is not None:
        since_us, what = _at_time(trace, us, "--since", since, t0_us), f"{us / 1e6:.3f} s"
    else:
        flag, name = ("--added", moment.phase_path) if added else ("--since", since.strip())
        phase = find_phase(trace, curves, name, flag)
        since_us, what = phase.start_us, f"the start of {phase.path}"
    if since_us > moment.time_us:
        start = recording_span(trace)[0] if t0_us is None else t0_us
        raise UsageError(
            f"--since: {what} ({(since_us - start) / 1e6:.3f} s) comes after {moment.what} "
            f"({(moment.time_us - start) / 1e6:.3f} s); nothing made then can be live at that moment"
        )
    return Moment(moment.time_us, moment.event_index, moment.what, moment.phase_path, since_us, what)


def rank_at(rank, at: str):
    """The analysed rank whose events hold the moment ``--at`` names: the serving window's
    (``AnalysedRank.serving``, None when the rank holds it joined in time) for an OOM inside it, for ``serving``
    or for a time inside it; else ``rank``. UsageError for a time in the gap between start-up and the window (its
    events were dropped)."""
    win = rank.serving
    if win is None:
        return rank
    text = at.strip().lower()
    w, t0 = rank.trace.window, rank.origin.t0_us
    if text == "oom":
        return win if rank.oom is not None and rank.oom.time_us >= w.start_us else rank
    if text == "serving":
        return win
    us = parse_time_us(text)
    if us is None:
        return rank
    if w.startup_end_us is not None and w.startup_end_us < t0 + us < w.start_us:
        raise UsageError(
            f"--at {at}: the gap between start-up ({(w.startup_end_us - t0) / 1e6:.3f} s) and the serving window "
            f"({(w.start_us - t0) / 1e6:.3f} s to {(w.end_us - t0) / 1e6:.3f} s): its events were dropped from the "
            "ring; give a time in either"
        )
    return win if t0 + us >= w.start_us else rank


def flame_for(rank, at: str = "peak", *, since: str | None = None, added: bool = False, non_torch: bool = True):
    """(moment, flame) of an analysed rank (``analysis.rank.AnalysedRank``) at ``--at`` with ``--since`` /
    ``--added``, times counted from the run's origin; the rank's lifetimes and tensor notes shared."""
    from memtrace.analysis.holders.flame import flame_at
    from memtrace.analysis.holders.live import knows_holders
    from memtrace.importers.kineto import SIZES_ONLY_NOTE

    if not knows_holders(rank.trace):
        raise UsageError(f"{rank.trace.label}: {SIZES_ONLY_NOTE}; plot or report show what it holds")
    t0 = rank.origin.t0_us
    if at.strip().lower() == "peak":  # the run's headline peak, read where the rank decided it
        at_moment = peak_moment(rank)
    else:
        at_moment = resolve_moment(rank.trace, rank.curves, at, t0_us=t0)
    moment = with_since(rank.trace, rank.curves, at_moment, since, added, t0_us=t0)
    flame = flame_at(
        rank.trace,
        moment.time_us if moment.event_index is None else None,
        event_index=moment.event_index,
        since_us=moment.since_us,
        non_torch=non_torch,
        lt=rank.lifetimes,
        notes=rank.tensor_notes,
    )
    return moment, flame


def seconds_showing(rank, time_us: int, since_us: int | None, shown) -> str:
    """``time_us`` in seconds from the run's origin, in the fewest decimals (ms, then down to µs) at which
    ``--at`` shows the bytes flame ``shown`` (``holders.flame.Flame``) shows live in PyTorch and committed
    through CUDA VMM: ms rounding can land before the change that made a moment (h200/startup-cap16g's peak at
    7.050455 s: ``--at 7.050`` shows 0.25 GiB less). Six decimals when none does (several changes in one µs).
    Each candidate's bytes are read from the rank's lifetimes and VMM records (:func:`_bytes_shown`), no flame built."""
    t0, (start, end) = rank.origin.t0_us, recording_span(rank.trace)
    secs, shows = (time_us - t0) / 1e6, (shown.torch_bytes, shown.vmm_bytes)
    for digits in (3, 4, 5):
        text = f"{secs:.{digits}f}"
        t = t0 + (parse_time_us(text) or 0)
        if start <= t <= end and _bytes_shown(rank, t, since_us, shown.vmm_bytes is not None) == shows:
            return text
    return f"{secs:.6f}"


def _bytes_shown(rank, t_us: int, since_us: int | None, vmm: bool) -> tuple[int, int | None]:
    """(PyTorch's live bytes, the KV cache's committed outside PyTorch or None) at ``t_us``, made at or after
    ``since_us``: ``flame_at``'s ``torch_bytes`` and ``vmm_bytes`` there (blocks from before recording never count
    from a moment on)."""
    from memtrace.analysis.holders.live import live_bytes_at
    from memtrace.analysis.memory.vmm import has_vmm, live_kv_chunks

    chunks = live_kv_chunks(rank.trace, t_us) if vmm and has_vmm(rank.trace) else []
    chunks = [c.bytes for c in chunks if since_us is None or c.time_us >= since_us]
    return live_bytes_at(rank.lifetimes, t_us, since_us), sum(chunks) if chunks else None


def seconds_text(us: int) -> str:
    """A time the user gave (``--at 7.0505``), in seconds as precise as given: 3 decimals at least, 6 at most."""
    text = f"{us / 1e6:.6f}".rstrip("0")
    whole, _, frac = text.partition(".")
    return f"{whole}.{frac.ljust(3, '0')}"
