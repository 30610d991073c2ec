"""The clock every memtrace time is stamped with, and how a worker's clock is compared with the driver's.

Times in a trace are Unix-epoch microseconds read on the host that recorded it. Ranks recorded on
different hosts read different clocks, so each session records, in the fact ``clock``
(:data:`memtrace.facts.CLOCK`), its host and its offset to the clock of the host that started the run
(the driver):

- ``same-host``: the worker runs on the driver's host (``MEMTRACE_DRIVER_HOST`` names it; unset, the
  run started here): one clock, offset 0 ± 0.
- ``ray``: measured through Ray against memtrace's collector actor on the driver's node
  (:mod:`.ray_gather`) by :func:`measure_offset`: a few round trips, the one with the smallest
  round-trip time kept; offset = driver − (t0 + t1) / 2, uncertainty = RTT / 2. A time ``t`` of this
  trace is ``t + offset_us`` on the driver's clock.
- ``unmeasured``: another host and no way to measure: the offset is unknown (null).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The host that started the run (exported by ``memtrace run`` and the vLLM plugin, carried to workers).
DRIVER_HOST_ENV = "MEMTRACE_DRIVER_HOST"
#: Round trips :func:`measure_offset` makes by default (each ~0.5-2 ms through a Ray actor on one machine).
ROUNDS = 8


def now_us() -> int:
    """Unix-epoch microseconds on this host, the clock of every memtrace time."""
    return time.time_ns() // 1000


@dataclass(frozen=True)
class Offset:
    """A measured offset to a reference clock: ``reference ≈ local + offset_us`` within ``uncertainty_us``."""

    offset_us: int
    uncertainty_us: int
    rtt_us: int
    rounds: int


def measure_offset(
    remote_now: Callable[[], int], *, rounds: int = ROUNDS, local_now: Callable[[], int] = now_us
) -> Offset:
    """Offset of the clock behind ``remote_now`` relative to ``local_now`` (both in microseconds).

    Each round reads ``t0 = local_now()``, ``r = remote_now()``, ``t1 = local_now()``; the round with the
    smallest ``t1 - t0`` is kept: offset = ``r - (t0 + t1) / 2``, uncertainty = ``(t1 - t0) / 2``
    (the remote reading lies somewhere inside the round trip).

    Args:
        remote_now: reads the reference clock (a call into the driver's node).
        rounds: how many round trips (at least 1).
        local_now: this process's clock (injectable for tests).
    """
    best: tuple[int, int, int] | None = None  # (rtt, t0 + t1, remote)
    for _ in range(max(int(rounds), 1)):
        t0 = local_now()
        remote = int(remote_now())
        t1 = local_now()
        rtt = max(t1 - t0, 0)
        if best is None or rtt < best[0]:
            best = (rtt, t0 + t1, remote)
    rtt, twice_mid, remote = best  # type: ignore[misc]
    return Offset(
        offset_us=remote - twice_mid // 2, uncertainty_us=(rtt + 1) // 2, rtt_us=rtt, rounds=max(int(rounds), 1)
    )


def hostname() -> str:
    return socket.gethostname()


def driver_host(environ: dict[str, str] | None = None) -> str:
    """The host that started the run: ``MEMTRACE_DRIVER_HOST``, else this one."""
    environ = os.environ if environ is None else environ
    return environ.get(DRIVER_HOST_ENV, "").strip() or hostname()


def export_driver_host(environ: Any = None) -> str:
    """Name this host as the run's driver for every child process, unless a parent already did."""
    environ = os.environ if environ is None else environ
    if not environ.get(DRIVER_HOST_ENV, "").strip():
        environ[DRIVER_HOST_ENV] = hostname()
    return environ[DRIVER_HOST_ENV]


def local_fact(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``clock`` fact of a process that measured nothing: ``same-host`` when it runs on the driver's
    host, else ``unmeasured``."""
    host, driver = hostname(), driver_host(environ)
    if host == driver:
        return {
            "host": host,
            "reference_host": driver,
            "method": "same-host",
            "offset_us": 0,
            "uncertainty_us": 0,
        }
    return {
        "host": host,
        "reference_host": driver,
        "method": "unmeasured",
        "offset_us": None,
        "uncertainty_us": None,
    }


def measured_fact(offset: Offset, reference_host: str, *, method: str = "ray", **extra: Any) -> dict[str, Any]:
    """The ``clock`` fact of a process that measured its offset to the driver's clock."""
    return {
        "host": hostname(),
        "reference_host": reference_host,
        "method": method,
        "offset_us": offset.offset_us,
        "uncertainty_us": offset.uncertainty_us,
        "rtt_us": offset.rtt_us,
        "rounds": offset.rounds,
        "measured_at_us": now_us(),
        **extra,
    }
