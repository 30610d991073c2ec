"""Ask a running traced worker for its serving window (SIGUSR2), only where that cannot harm anything else.

SIGUSR2's default action is to terminate the process: sent to a worker that is not in serving mode, to the API
server, or to an unrelated process that reuses a finished worker's pid, it would kill it. :func:`ask` signals a
trace's process only when it is on this host, still the process that wrote the trace (started before the trace
began: a reused pid belongs to a younger process) and catches SIGUSR2 (``SigCgt`` in ``/proc/<pid>/status``: the
handler ``capture.signals.install_snapshot`` installs when serving begins); then it waits until the trace's window
document shows a newer write. Linux only (``/proc``). Trace files are read only through ``memtrace.store``.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from memtrace import facts as F
from memtrace.store import SUFFIX, read_document, read_fact

#: Slack for the process's start time (``/proc/stat``'s boot time is whole seconds).
START_SLACK_S = 1.0
POLL_S = 0.2


@dataclass(frozen=True)
class Asked:
    """What became of one trace file: ``written`` (a new window is on disk), ``skipped`` (not asked: why), or
    ``late`` (asked, no new window in time)."""

    path: Path
    outcome: str  # "written", "skipped", "late"
    line: str
    serving: bool = True  # False: the trace was not recorded in serving mode


def _proc_start_s(pid: int) -> float | None:
    """When process ``pid`` started (Unix seconds), from ``/proc``; None when it is not running."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        btime = next(
            int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
    except (OSError, StopIteration, ValueError):
        return None
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the command name (which may hold spaces)
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (``SigCgt``: the caught signals' mask)."""
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)


def _writes(path: Path) -> int:
    doc = read_document(path, "window")
    return int(doc.get("writes", 0)) if isinstance(doc, dict) else 0


def ask(path: Path, timeout_s: float) -> Asked:
    """Ask the process that writes trace ``path`` for its window now, if that is safe, and wait for it."""
    if not path.name.endswith(SUFFIX):
        return Asked(path, "skipped", "a compressed copy: its process has finished")
    process, recording = read_document(path, "process"), read_document(path, "recording")
    if not isinstance(process, dict) or not isinstance(recording, dict):
        return Asked(path, "skipped", "not readable yet (being created?): try again")
    if read_fact(path, F.SERVING) is None:
        return Asked(path, "skipped", "recorded without --until serving: it keeps no window", serving=False)
    pid, host = int(process.get("pid") or 0), str(process.get("hostname") or "")
    who = f"pid {pid}" + (f" (rank {process['rank']})" if process.get("rank") is not None else "")
    if host and host != socket.gethostname():
        return Asked(path, "skipped", f"{who} runs on host {host}: run memtrace window there")
    started = _proc_start_s(pid) if pid > 0 else None
    if started is None:
        return Asked(path, "skipped", f"{who} is not running: the window on disk is its last")
    began = (recording.get("start_us") or 0) / 1e6
    if started > began + START_SLACK_S:
        return Asked(path, "skipped", f"{who} is another process now (it started after this trace began): left alone")
    if not _catches(pid, signal.SIGUSR2):
        return Asked(path, "skipped", f"{who} does not catch SIGUSR2 (not serving yet?): not signalled, it would die")
    before = _writes(path)
    try:
        os.kill(pid, signal.SIGUSR2)
    except OSError as exc:
        return Asked(path, "skipped", f"{who} could not be signalled: {exc.strerror or exc}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(POLL_S)
        doc = read_document(path, "window")
        if isinstance(doc, dict) and int(doc.get("writes", 0)) > before:
            span = (int(doc.get("end_us") or 0) - int(doc.get("start_us") or 0)) / 1e6
            return Asked(
                path,
                "written",
                f"{who}: window written ({doc.get('reason')}, write {doc.get('writes')}): {span:.2f} s kept, "
                f"{int(doc.get('events_kept', 0)):,} allocator events, {int(doc.get('events_dropped', 0)):,} dropped, "
                f"{int(doc.get('steps_kept', 0)):,} scheduler steps",
            )
    return Asked(path, "late", f"{who} was asked (SIGUSR2) and wrote no new window within {timeout_s:g} s")
