"""TEST-ONLY FAKE: a host whose clock is off, for the Ray tests that measure and align a worker's clock.

With ``MT_TEST_CLOCK_SKEW_US=N`` in a process's environment and ``tests/worker_shim`` on its
``PYTHONPATH``, the moment ``memtrace.capture.clock`` is imported its ``time`` is replaced by one whose
``time_ns()`` reads N µs ahead, so :func:`memtrace.capture.clock.now_us` does too. Patching the module's
``time`` rather than ``now_us`` reaches every binding of the function at once (``from .clock import
now_us`` in other modules, ``measure_offset``'s default ``local_now``). It shifts what memtrace stamps on
the Python side (phases, notes, facts, the session's start and end), not PyTorch's allocator clock, the
NVML sidecar's, nor anything else in the process that reads ``time``.
"""

import os

ENV = "MT_TEST_CLOCK_SKEW_US"
TARGET = "memtrace.capture.clock"


class SkewedTime:
    """The ``time`` module with ``time_ns()`` ``skew_us`` microseconds ahead; every other name is time's."""

    def __init__(self, real, skew_us: int):
        self._real = real
        self._skew_ns = skew_us * 1000

    def time_ns(self) -> int:
        return self._real.time_ns() + self._skew_ns

    def __getattr__(self, name):
        return getattr(self._real, name)


def skew_us(environ=os.environ) -> int:
    """The skew this process asks for, in microseconds (0 when unset or not an integer)."""
    try:
        return int(environ.get(ENV, "").strip() or 0)
    except ValueError:
        return 0


if skew_us():
    from mt_test_after_import import after_import

    def _skew(module):
        module.time = SkewedTime(module.time, skew_us())

    after_import(TARGET, _skew)
