"""The capture's background writer: one thread that converts drained allocator history and writes it.

A drain must take PyTorch's snapshot and clear the history on the traced thread, back to back (that
is what makes it lossless); turning the snapshot's entries into events, interning their stacks and
appending them to the trace file need not. The session hands that work here, in order, and waits for
it where a complete file is promised: ``flush()`` (the OOM path writes the whole trace before the
error propagates), ``close()`` for any reason but the end of vLLM's start-up, and at exit.

``MEMTRACE_CAPTURE_SYNC=1`` does everything on the traced thread, as before (for debugging, and
for ``tests/bench/bench_capture_cost.py``'s before/after).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable

from memtrace.capture import selfcost

log = logging.getLogger("memtrace")

SYNC_ENV = "MEMTRACE_CAPTURE_SYNC"


def synchronous() -> bool:
    """True when ``MEMTRACE_CAPTURE_SYNC`` asks for all capture work on the traced thread."""
    return os.environ.get(SYNC_ENV, "").strip() not in ("", "0")


class Background:
    """A single worker thread running submitted tasks in order; errors are reported, never raised."""

    def __init__(self, on_error: Callable[[str], None]):
        self._queue: queue.Queue = queue.Queue()
        self._on_error = on_error
        self._thread = threading.Thread(target=self._run, name="memtrace-writer", daemon=True)
        self._thread.start()

    def submit(self, task: Callable[[], None]) -> None:
        self._queue.put(task)

    def wait(self, timeout: float | None = None) -> bool:
        """Return once every task submitted so far has run (at once on the worker itself); False
        if ``timeout`` seconds passed first."""
        if threading.current_thread() is self._thread:
            return True
        q = self._queue
        deadline = None if timeout is None else time.monotonic() + timeout
        with q.all_tasks_done:
            while q.unfinished_tasks:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                q.all_tasks_done.wait(remaining)
        return True

    def end(self) -> None:
        """End the thread once what is queued has run (without waiting; fine on the worker itself)."""
        self._queue.put(None)

    def stop(self) -> None:
        """Run what is queued, then end the thread."""
        if threading.current_thread() is self._thread:
            return
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        selfcost.mark_own_thread()  # its work is memtrace's, off the program's threads
        while True:
            task = self._queue.get()
            try:
                if task is None:
                    return
                with selfcost.region("background"):
                    task()
            except Exception as exc:  # a bug here must not kill the traced program or lose the rest
                log.warning("memtrace: background write failed: %s", exc)
                try:
                    self._on_error(f"background write failed: {exc!r}")
                except Exception:  # noqa: BLE001
                    pass
            finally:
                self._queue.task_done()
