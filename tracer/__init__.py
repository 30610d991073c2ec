"""memtrace: an exact timeline of GPU memory during vLLM start-up.

Importing memtrace is cheap: it imports no torch, matplotlib or vLLM and never touches CUDA.
The public API is loaded on first use:

- ``memtrace.trace(path)`` / ``memtrace.start()`` / ``memtrace.stop()``: record any PyTorch program.
- ``memtrace.phase(name)``: mark a phase (context manager or decorator).
- ``memtrace.load(path)``: read a run directory or a trace file (plain or ``.xz``/``.gz``) into
  ``memtrace.model.Run``.
- ``memtrace.current_session()``: the session recording this process, if any.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and editors see; at run time these load on first use (__getattr__)
    from memtrace.capture.api import current_session, phase, start, stop, trace
    from memtrace.store import load_run as load

__version__ = "0.1.0"

__all__ = ["__version__", "current_session", "load", "phase", "start", "stop", "trace"]

_LAZY = {
    "trace": ("memtrace.capture.api", "trace"),
    "start": ("memtrace.capture.api", "start"),
    "stop": ("memtrace.capture.api", "stop"),
    "phase": ("memtrace.capture.api", "phase"),
    "current_session": ("memtrace.capture.api", "current_session"),
    "load": ("memtrace.store", "load_run"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'memtrace' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API (for completion), without loading it."""
    return sorted({*__all__, *globals()} - {"TYPE_CHECKING", "Any", "annotations"})
