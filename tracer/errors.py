"""memtrace's own error types: a user-caused problem is one line and an exit code, never a traceback."""

from __future__ import annotations


class MemtraceError(Exception):
    """An error the user can fix. ``str(err)`` is one line saying what is wrong and what to do.

    The CLI prints ``memtrace: error: <message>`` and exits with ``exit_code`` (2 by default).
    """

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class TraceFormatError(MemtraceError):
    """A file is missing, empty, corrupt, foreign, or from an unknown format version."""


class UsageError(MemtraceError):
    """An argument is invalid (unknown rank, a moment outside the run, a bad size...)."""


class NothingToJudge(MemtraceError):
    """A run recorded no allocator events, so a gate (``diff``, ``fits``, ``history``, the pytest gate) has
    nothing to judge: one line saying what is missing, exit code 1 (a CI job that lost its GPU fails)."""

    exit_code = 1


class SeparateRuns(UsageError):
    """A run directory holds the traces of more than one run (``memtrace run --force`` into a used folder):
    never merged; the message names both and how to split them."""
