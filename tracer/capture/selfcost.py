"""memtrace's own time on the traced process's threads, by source: what recording costs the program.

Every piece of memtrace that runs on a thread of the traced program (vLLM's worker thread, or any
thread that calls a hooked function) brackets itself with two reads of ``time.perf_counter_ns``
(monotonic) and charges the difference to a *source*: ``registration``, ``patching`` (hooks applied
when vLLM imports a watched module), ``start`` (session start-up; its wait for the NVML sidecar's
first samples apart, ``start.sidecar_wait``; the vLLM plugin's wait for its capture code's import on a thread of its
own, ``start.preimport_wait``), ``phase_memory`` (the device readings at vLLM's phase edges),
``calibration`` (the allocator history's cost estimate, :mod:`.history_cost`), ``hooks.<kind>`` (a
hook's wrapper and handler, apart from the wrapped call), ``drain.<reason>`` (PyTorch's snapshot and
clear of the allocator history), ``writes`` (the trace file's SQLite writes), ``oom`` and ``stop``.

Time is *exclusive*: a region nested in another (a drain inside a phase hook) is charged to its own
source only, never twice. Each thread keeps its own :class:`Tally` (no lock on the hot path: a region
costs two clock reads and a few dict updates, a few hundred ns in CPython); the tallies are summed
when the trace's fact is written. Threads memtrace starts itself (the background writer) mark their
tally ``own``: their time is reported apart, as not spent on the program's threads. The watchdog's
drains are charged (``drain.watchdog``): they hold the GIL and the allocator's lock while they run.

A tally lives in this module (plugins time their registration before any session exists) and is
reset in a forked child: a trace counts what its own process spent.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any

clock = time.perf_counter_ns

REGISTRATION = "registration"
PATCHING = "patching"  # hooks applied when a watched module is imported (after registration)
START = "start"
START_SIDECAR_WAIT = "start.sidecar_wait"  # the session's start waiting for the NVML sidecar's first samples
START_PREIMPORT_WAIT = "start.preimport_wait"  # vLLM's plugin waiting for its capture code's import on its own thread
PHASE_MEMORY = "phase_memory"  # the device readings at vLLM's phase edges (``plugins.vllm_boundaries``)
CALIBRATION = "calibration"
WRITES = "writes"
PHASES = "phases"  # the session's phase bookkeeping (record_function ranges, the phase rows)
FLUSH = "flush"  # a flush: its drain apart, the wait for the background writer
OOM = "oom"
STOP = "stop"
HOOKS = "hooks"  # prefix: hooks.phases, hooks.flashinfer, hooks.vmm, hooks.sizing_reads, hooks.ray
DRAIN = "drain"  # prefix: drain.phase, drain.flush, drain.stop, drain.watchdog


class Tally:
    """One thread's accumulated nanoseconds and calls by source."""

    __slots__ = ("ns", "calls", "inner", "own", "thread")

    def __init__(self, own: bool = False) -> None:
        self.ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.inner = 0  # nanoseconds of completed regions on this thread (what an enclosing region subtracts)
        self.own = own  # a thread memtrace started itself
        self.thread = threading.current_thread().name


class _Local(threading.local):
    tally: Tally | None = None


_local = _Local()
_tallies: list[Tally] = []
_tallies_lock = threading.Lock()


def tally() -> Tally:
    """This thread's tally (created on first use)."""
    t = _local.tally
    if t is None:
        t = _local.tally = Tally()
        with _tallies_lock:
            _tallies.append(t)
    return t


def mark_own_thread() -> None:
    """Say that the calling thread is one of memtrace's own (its time is not the program's)."""
    tally().own = True


def charge(t: Tally, source: str, t0: int, inner0: int, calls: int = 1) -> None:
    """Charge the region that began at ``t0`` (clock ns; ``inner0`` = ``t.inner`` then) to ``source``,
    minus the regions nested in it; ``calls`` 0 for the second part of one call (a hook's ``after``)."""
    dt = clock() - t0
    own = dt - (t.inner - inner0)
    t.inner = inner0 + dt
    t.ns[source] = t.ns.get(source, 0) + own
    t.calls[source] = t.calls.get(source, 0) + calls


class region:
    """``with selfcost.region("writes"):`` (for code off the hottest paths; hooks call :func:`charge`)."""

    __slots__ = ("source", "_t", "_t0", "_inner0")

    def __init__(self, source: str) -> None:
        self.source = source

    def __enter__(self) -> region:
        self._t = t = tally()
        self._inner0 = t.inner
        self._t0 = clock()
        return self

    def __exit__(self, *exc: Any) -> None:
        charge(self._t, self.source, self._t0, self._inner0)


def timed(source: str):
    """Decorator: charge every call of the function to ``source``."""

    def wrap(func):
        @functools.wraps(func)
        def run(*args, **kwargs):
            t = tally()
            inner0 = t.inner
            t0 = clock()
            try:
                return func(*args, **kwargs)
            finally:
                charge(t, source, t0, inner0)

        return run

    return wrap


def totals(since: dict[str, Any] | None = None, *, registration: bool = True) -> dict[str, Any]:
    """The process's figures so far: ``sources`` ({source: {"ns", "calls"}}) on the program's threads,
    ``total_ns``, ``threads`` (names of the program's threads that spent any), and ``memtrace_threads_ns``
    (time charged on memtrace's own threads, not counted in ``total_ns``).

    ``since``: an earlier ``totals()`` (a session's start) to subtract, registration excepted (the
    plugin registers once per process, before any session) unless ``registration`` is False (a span inside a
    session: serving).
    """
    with _tallies_lock:
        tallies = list(_tallies)
    sources: dict[str, dict[str, int]] = {}
    threads: list[str] = []
    own_ns = 0
    for t in tallies:
        ns, calls = dict(t.ns), dict(t.calls)  # copies: the thread may be charging right now
        if t.own:
            own_ns += sum(ns.values())
            continue
        if ns:
            threads.append(t.thread)
        for source, value in ns.items():
            acc = sources.setdefault(source, {"ns": 0, "calls": 0})
            acc["ns"] += value
            acc["calls"] += calls.get(source, 0)
    for source, before in (since or {}).get("sources", {}).items():
        if (source != REGISTRATION or not registration) and source in sources:
            sources[source] = {k: sources[source][k] - before[k] for k in ("ns", "calls")}
            if not any(sources[source].values()):
                del sources[source]
    own_ns -= (since or {}).get("memtrace_threads_ns", 0)
    return {
        "clock": "perf_counter_ns",
        "sources": dict(sorted(sources.items())),
        "total_ns": sum(s["ns"] for s in sources.values()),
        "threads": sorted(set(threads)),
        "memtrace_threads_ns": own_ns,
    }


_claimed: dict[str, Any] | None = None


def claim() -> None:
    """A session's trace is complete: what was spent so far is its, and the next session's counts from here."""
    global _claimed
    _claimed = totals()


def claimed() -> dict[str, Any] | None:
    """The totals a finished session of this process took (None before any)."""
    return _claimed


def reset() -> None:
    """Forget every tally (a forked child, where another thread may have held the lock; tests)."""
    global _local, _tallies, _tallies_lock, _claimed
    _tallies, _tallies_lock, _local, _claimed = [], threading.Lock(), _Local(), None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=reset)
