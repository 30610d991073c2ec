"""Read whatever file or directory a user hands to a command: a run, a trace, or a torch snapshot.

- a directory: a run (``*.memtrace`` files, one per process);
- a ``.memtrace`` (SQLite) file: one trace;
- a PyTorch ``_dump_snapshot`` pickle: only when its name ends in ``.pickle``/``.pkl`` or the user
  passed ``--allow-pickle``. Unpickling can run code, so a one-line warning goes to stderr, and the
  unpickler here only builds plain containers (dict, list, str, numbers...): a pickle that names
  any class or function is refused instead of being run.

Every problem a user can cause is a ``TraceFormatError`` (one line, exit 2). Inputs are opened
read-only and never modified.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..errors import TraceFormatError
from ..model import Run, Trace

PICKLE_SUFFIXES = (".pickle", ".pkl")
#: The only globals a snapshot pickle may name: containers the standard library rebuilds harmlessly.
_SAFE_GLOBALS = {
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "complex"),
    ("collections", "OrderedDict"),
    ("collections", "defaultdict"),
}


class _SnapshotUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a PyTorch memory snapshot never holds")


def is_pickle_path(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(PICKLE_SUFFIXES)


def warn_pickle(path: str | os.PathLike) -> None:
    print(
        f"memtrace: warning: reading {path} as a pickle; unpickling can run code, so only read snapshots you trust",
        file=sys.stderr,
    )


def read_snapshot(path: str | os.PathLike) -> dict[str, Any]:
    """Unpickle a ``torch.cuda.memory._dump_snapshot`` file into plain dicts (no code is run)."""
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(f"{path}: no such file; pass the pickle written by torch.cuda.memory._dump_snapshot()")
    if path.is_dir():
        raise TraceFormatError(f"{path} is a directory; pass the snapshot pickle file itself")
    data = path.read_bytes()
    if not data:
        raise TraceFormatError(f"{path} is empty; dump the snapshot again with torch.cuda.memory._dump_snapshot()")
    try:
        snapshot = _SnapshotUnpickler(io.BytesIO(data)).load()
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        IndexError,
        KeyError,
        AttributeError,
        ImportError,
        UnicodeDecodeError,
        OverflowError,
        MemoryError,
    ) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceFormatError(
            f"{path} is not a readable PyTorch snapshot pickle ({why}); dump it again with "
            "torch.cuda.memory._dump_snapshot()"
        ) from None
    return snapshot


def trace_from_snapshot_file(path: str | os.PathLike, *, device: int | None = None) -> Trace:
    """Read a snapshot pickle and convert it with ``memtrace.importers.torch_snapshot``."""
    from .torch_snapshot import trace_from_snapshot

    snapshot = read_snapshot(path)
    trace = trace_from_snapshot(snapshot, device=device, source=str(path))
    if len(trace.events) == 0:
        raise TraceFormatError(
            f"{path} holds allocator state but no events (no history was recorded); call "
            "torch.cuda.memory._record_memory_history() before the workload, then dump the snapshot"
        )
    trace.path = str(path)
    return trace


def load_input(
    path: str | os.PathLike,
    *,
    allow_pickle: bool = False,
    device: int | None = None,
    each: Callable[[list[Path]], Iterable[Path]] | None = None,
) -> Run:
    """A Run from a run directory, a ``.memtrace`` file, or (see module docstring) a snapshot pickle.

    ``each`` wraps a run directory's file list as it is read (a progress bar).
    """
    from ..store import SQLITE_MAGIC, load_run

    p = Path(path)
    if not p.exists():
        raise TraceFormatError(f"{p}: no such file or directory; pass a run directory, a .memtrace file or a snapshot")
    if p.is_dir():
        return load_run(p, each=each)
    if is_pickle_path(p) or allow_pickle:
        try:
            with open(p, "rb") as f:
                head = f.read(16)
        except OSError as exc:
            raise TraceFormatError(f"cannot read {p}: {exc.strerror or exc}; check its permissions") from None
        if head == SQLITE_MAGIC:  # a trace misnamed .pkl: read it as what it is
            return load_run(p)
        warn_pickle(p)
        return Run(path=str(p), traces=[trace_from_snapshot_file(p, device=device)])
    return load_run(p)
