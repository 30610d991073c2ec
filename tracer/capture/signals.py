"""Write the trace at interpreter exit, on SIGTERM and on SIGINT, then let the program go on as before.

- ``atexit``: ``stop("exit")``, then wait for any trace still being finished in the background.
- SIGTERM: ``stop("signal:SIGTERM")``, then the previous handler is called; with the default
  handler the signal is re-raised with the default action, so the process still dies of SIGTERM.
- SIGINT: the trace is flushed (the program may catch KeyboardInterrupt and carry on), then the
  previous handler runs (by default it raises KeyboardInterrupt).

- SIGUSR2 (serving mode only, :func:`install_snapshot`): the serving window is written and the process
  goes on serving. A handler installed before memtrace's is called after it; with the default disposition
  (which would terminate the process) or SIG_IGN nothing else happens: asking for serving mode is asking
  for SIGUSR2 to mean "write the window".
- In serving mode SIGINT writes the window (instead of a flush) and SIGTERM and exit close the trace
  with it (:mod:`.serving_session`).

Handlers can only be installed from the main thread; elsewhere only ``atexit`` is installed.
SIGKILL cannot be caught: everything flushed before it (every drain, phase, fact) and the NVML
sidecar's samples stay readable.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from typing import Any

log = logging.getLogger("memtrace")

_installed = False
_previous: dict[int, Any] = {}


def _on_exit() -> None:
    from memtrace.capture.registry import active_session, wait_finishing

    session = active_session()
    if session is not None:
        try:
            session.close("exit")
        except Exception as exc:
            log.warning("memtrace: could not write the trace at exit: %s", exc)
    wait_finishing()  # a trace closed at the end of start-up may still be written in the background


def _handler(signum: int, frame: Any) -> None:
    from memtrace.capture.registry import active_session

    session = active_session()
    name = signal.Signals(signum).name
    if session is not None:
        try:
            if signum == signal.SIGINT:
                session.add_note("info", "SIGINT received")
                if getattr(session, "serving", None) is None or not session.write_window("signal:SIGINT"):
                    session.flush()
            else:
                session.close(f"signal:{name}")
        except Exception as exc:
            log.warning("memtrace: could not write the trace on %s: %s", name, exc)
    if signum != signal.SIGINT:
        from memtrace.capture.registry import wait_finishing

        wait_finishing()
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:  # SIG_DFL (or None: installed from C): die of the signal as the program would have
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install() -> bool:
    """Install the exit and signal handlers once per process. False if signals could not be set."""
    global _installed
    if _installed:
        return True
    atexit.register(_on_exit)
    if threading.current_thread() is not threading.main_thread():
        log.info("memtrace: not on the main thread: trace written at exit only, not on SIGTERM/SIGINT")
        _installed = True
        return False
    for sig in (signal.SIGTERM, signal.SIGINT):
        _previous[sig] = signal.getsignal(sig)
        signal.signal(sig, _handler)
    _installed = True
    return True


def _snapshot(signum: int, frame: Any) -> None:
    """SIGUSR2 in serving mode: write the window, then call the handler that was there before, if any."""
    from memtrace.capture.registry import active_session

    session = active_session()
    if session is not None:
        try:
            session.write_window("signal:SIGUSR2")
        except Exception as exc:  # never let a snapshot stop the server
            log.warning("memtrace: could not write the serving window on SIGUSR2: %s", exc)
    previous = _previous.get(signal.SIGUSR2)
    if callable(previous):
        previous(signum, frame)


def install_snapshot() -> bool:
    """Install the SIGUSR2 handler once (serving mode); False off the main thread (then no snapshot on demand)."""
    if signal.SIGUSR2 in _previous:
        return True
    if threading.current_thread() is not threading.main_thread():
        log.info("memtrace: not on the main thread: no serving snapshot on SIGUSR2 (written at exit/SIGTERM/OOM)")
        return False
    _previous[signal.SIGUSR2] = signal.getsignal(signal.SIGUSR2)
    signal.signal(signal.SIGUSR2, _snapshot)
    return True
