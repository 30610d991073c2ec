"""Which session records this process, where its trace file goes, and which closed sessions are
still being finished by their background writer (exit and SIGTERM wait for them).

Every session gets the fact ``clock`` (:mod:`.clock`); one started inside a Ray worker of a run with a
collector is tied to it (:mod:`.ray_gather`): it measures its clock through Ray, writes on its own node
when that is not the driver's, and hands its file over once it is complete."""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memtrace.capture import clock
from memtrace.errors import MemtraceError, UsageError
from memtrace.store import SUFFIX, trace_files

if TYPE_CHECKING:
    from memtrace.capture.session import Session

log = logging.getLogger("memtrace")

STACKS = ("none", "python", "all")
#: Overrides the NVML sampling rate of every session started in this process (0: no sidecar).
SAMPLE_HZ_ENV = "MEMTRACE_SAMPLE_HZ"

_active: Session | None = None
_active_lock = threading.RLock()


def now_us() -> int:
    """Unix-epoch microseconds, the clock of every time in a trace (:func:`.clock.now_us`)."""
    return clock.now_us()


def active_session() -> Session | None:
    """The session recording this process (None in a forked child of a recording process)."""
    s = _active
    if s is not None and s.pid != os.getpid():
        return None
    return s


def run_dir(path_or_dir: str | os.PathLike | None) -> Path:
    """The run directory: the argument, else ``$MEMTRACE_DIR``, else a new timestamped one (exported)."""
    if path_or_dir is not None:
        return Path(path_or_dir)
    env = os.environ.get("MEMTRACE_DIR")
    if env:
        return Path(env)
    path = Path.cwd() / time.strftime("memtrace-%Y%m%d-%H%M%S")
    os.environ["MEMTRACE_DIR"] = str(path)  # children of this process write next to us
    return path


def trace_path(path_or_dir: str | os.PathLike | None, rank: int | None) -> Path:
    """``<run_dir>/<host>-pid<pid>[-rank<r>].memtrace``, or the given ``.memtrace`` path."""
    if path_or_dir is not None and str(path_or_dir).endswith(SUFFIX):
        return Path(path_or_dir)
    name = f"{socket.gethostname()}-pid{os.getpid()}" + (f"-rank{rank}" if rank is not None else "")
    return run_dir(path_or_dir) / (name + SUFFIX)


def name_parts(name: str) -> tuple[str, int, int | None] | None:
    """(host, pid, rank or None) of a trace file named by :func:`trace_path` (compressed ones carry a further
    suffix); None for another name."""
    m = re.match(rf"^(?P<host>.+)-pid(?P<pid>\d+)(?:-rank(?P<rank>\d+))?{re.escape(SUFFIX)}", name)
    if m is None:
        return None
    return m["host"], int(m["pid"]), int(m["rank"]) if m["rank"] is not None else None


def claim(path_or_dir: str | os.PathLike | None, make: Callable[..., Session], **kwargs: Any) -> Session:
    """Check the session's settings, make it with ``make(trace path)`` and register it as the process's, all under
    the registry's lock (UsageError if one is recording). The caller (``session.begin_session``) starts it."""
    global _active
    with _active_lock:
        current = active_session()
        if current is not None:
            raise UsageError(
                f"memtrace is already recording this process to {current.path}; call memtrace.stop() first"
            )
        hz = os.environ.get(SAMPLE_HZ_ENV, "").strip()
        if hz and kwargs.get("sample_hz", 1.0) > 0:  # a measurement knob: 0 turns the sidecar off
            try:
                kwargs["sample_hz"] = max(float(hz), 0.0)
            except ValueError:
                raise UsageError(f"{SAMPLE_HZ_ENV}={hz!r} is not a number of samples per second") from None
        stacks = kwargs.get("stacks", "python")
        if stacks not in STACKS:
            raise UsageError(f"stacks={stacks!r} is not one of {', '.join(STACKS)}")
        _refuse_an_earlier_run(path_or_dir, kwargs.get("rank"))
        session = make(trace_path(path_or_dir, kwargs.get("rank")), **kwargs)
        _active = session
    return session


def _refuse_an_earlier_run(path_or_dir: str | os.PathLike | None, rank: int | None) -> None:
    """UsageError when the run folder named already holds another run's trace, as every reading command would
    find it (``analysis.analysed.run.separate_runs``): this rank's trace (a rank is recorded once per run), or,
    for a process without a rank, a rank-less trace whose recording has ended. So a script run twice into
    ``trace("runs/mine")`` is refused at its start, and the other processes of this run (every rank of a
    torchrun job calls ``trace()`` on one folder) are welcome. ``MEMTRACE_DIR`` (no argument) is ``memtrace
    run``'s, which refuses a used folder itself; a ``.memtrace`` path is never replaced (the store refuses it).
    Called by :func:`claim`, under the registry's lock, after the check that this process records nothing."""

    if path_or_dir is None or str(path_or_dir).endswith(SUFFIX) or not Path(path_or_dir).is_dir():
        return
    try:
        files = trace_files(path_or_dir)
    except MemtraceError:
        return  # unlistable: creating the trace file says why
    named = {f: name_parts(f.name) for f in files}
    if rank is not None:
        same = [f.name for f, parts in named.items() if parts is not None and parts[2] == rank]
        why = f"rank {rank}'s trace"
    else:
        same = [f.name for f, parts in named.items() if (parts is None or parts[2] is None) and _has_ended(f, parts)]
        why = "a finished run"
    if same:
        shown = ", ".join(same[:3]) + (f" and {len(same) - 3} more" if len(same) > 3 else "")
        raise UsageError(
            f"{path_or_dir} already holds {why} ({shown}); a folder holds one run: choose another folder or move "
            "those files away"
        )


def _has_ended(trace_file: Path, parts: tuple[str, int, int | None] | None) -> bool:
    """Whether ``trace_file`` (named ``parts``, :func:`name_parts`) is a recording that has ended. A trace of this
    host is named by its process: ended when that process is this one (an earlier session) or no longer runs
    (so the file is not opened). Another host's trace has ended once its end is written."""
    from memtrace.store import read_document

    if not trace_file.name.endswith(SUFFIX):
        return True  # compressed: written after its recording ended
    if parts is None or parts[0] != socket.gethostname():
        recording = read_document(trace_file, "recording")
        return isinstance(recording, dict) and recording.get("end_us") is not None
    pid = parts[1]
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass  # it runs, as another user
    return False


def deactivate(session: Session) -> None:
    """``session`` stopped recording: the process may start another."""
    global _active
    with _active_lock:
        if _active is session:
            _active = None


#: Sessions whose file is still being finished by their background writer.
_finishing: list[Session] = []
_exit_wait_registered = False


def finishing(session: Session) -> None:
    """``session``'s file is being finished in the background: exit waits for it."""
    _finishing.append(session)
    _wait_at_exit()


def finished(session: Session) -> None:
    """``session``'s file is complete and closed: hand it on when something waits for it (a collector)."""
    if session in _finishing:
        _finishing.remove(session)
    hand_over = getattr(session, "on_file_closed", None)
    if hand_over is not None:
        try:
            hand_over(session.path)
        except Exception:  # noqa: BLE001 - a bug here must not break the traced program's exit
            log.warning("memtrace: handing over %s failed", session.path, exc_info=True)


def wait_finishing() -> None:
    """Wait until every closed session's file is complete (at exit, on SIGTERM)."""
    for session in list(_finishing):
        session.wait_written()


def _wait_at_exit() -> None:
    """Make a multiprocessing child (a vLLM worker: it skips atexit) wait for its files at exit too."""
    global _exit_wait_registered
    if _exit_wait_registered:
        return
    _exit_wait_registered = True
    try:
        import atexit
        from multiprocessing import util

        atexit.register(wait_finishing)
        util.Finalize(None, wait_finishing, exitpriority=100)
    except Exception:  # noqa: BLE001
        log.debug("memtrace: no exit wait for the background writer", exc_info=True)
