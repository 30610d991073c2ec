"""Read whatever file or directory a user hands to a command: a run, a trace, or a torch snapshot.

- a directory: a run (``*.memtrace`` files, one per process, plain or ``.xz``/``.gz``-compressed);
- a ``.memtrace`` (SQLite) file, or one compressed (``.memtrace.xz``/``.gz``): one trace;
- a torch.profiler / Kineto trace (``.json``, ``.json.gz``) with ``[memory]`` events (``importers.kineto``);
- a PyTorch ``_dump_snapshot`` pickle: only when its name ends in ``.pickle``/``.pkl`` or the user
  passed ``--allow-pickle``. Unpickling can run code, so a one-line warning goes to stderr (once the file
  was read: a file that cannot be read is one error line, nothing before it), and the
  unpickler here only builds plain containers (dict, list, str, numbers...): a pickle that names
  any class or function is refused instead of being run.

Every problem a user can cause is a ``TraceFormatError`` (one line, exit 2). Inputs are opened
read-only and never modified.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from memtrace.errors import TraceFormatError
from memtrace.model import Run, Trace

PICKLE_SUFFIXES = (".pickle", ".pkl")
#: A torch.profiler (Kineto) trace's suffixes (``importers.kineto`` reads it; named here, where a file's kind
#: is decided, so that loading a .memtrace file imports no profiler reader)
PROFILER_SUFFIXES = (".json", ".json.gz", ".json.xz")
#: What ``torch.profiler.tensorboard_trace_handler`` names its files (vLLM's profiler uses it, gzip by default),
#: and the same recompressed with xz (half the size of gzip on these files).
PROFILER_NAMES = (".pt.trace.json", ".pt.trace.json.gz", ".pt.trace.json.xz")
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


def is_profiler_path(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(PROFILER_SUFFIXES)


def profiler_files(folder: str | os.PathLike) -> list[Path]:
    """The torch.profiler traces directly in ``folder`` (what vLLM's ``torch_profiler_dir`` holds), by name."""
    return sorted(f for f in Path(folder).iterdir() if f.is_file() and f.name.lower().endswith(PROFILER_NAMES))


def warn_pickle(path: str | os.PathLike) -> None:
    """Said once a pickle was read (a file that fails to read is one error line, no warning before it)."""
    print(
        f"memtrace: warning: read {path} as a pickle; unpickling can run code, so only read snapshots you trust",
        file=sys.stderr,
    )


def check_not_a_trace(path: str | os.PathLike) -> None:
    """Before ``memtrace import`` unpickles anything: ``path`` is a readable, non-empty file and not a
    memtrace trace. A trace (plain or compressed) is refused with the command that reads it; a truncated
    or corrupt one is said to be so (it is never read as a pickle)."""
    from memtrace.packed import compression, is_trace_name
    from memtrace.store import SQLITE_MAGIC, load_trace

    path = Path(path)
    if not path.exists():
        raise TraceFormatError(f"{path}: no such file; pass the pickle written by torch.cuda.memory._dump_snapshot()")
    if path.is_dir():
        raise TraceFormatError(f"{path} is a directory; pass the snapshot pickle file itself")
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise TraceFormatError(f"cannot read {path}: {exc.strerror or exc}; check its permissions") from None
    if not head:
        raise TraceFormatError(f"{path} is empty; dump the snapshot again with torch.cuda.memory._dump_snapshot()")
    packed = compression(head) is not None
    if not (head.startswith(SQLITE_MAGIC[:6]) or packed or (is_trace_name(path.name) and head[:1] != b"\x80")):
        return  # not a trace: a pickle (protocol 2+ starts with 0x80) or something read_snapshot refuses
    if head != SQLITE_MAGIC and not packed:
        raise TraceFormatError(
            f"{path} is a corrupt or truncated memtrace trace (no SQLite header); record the run again or restore a copy"
        )
    load_trace(path)  # a broken trace says what is wrong with it, in one line
    raise TraceFormatError(f"{path} is a memtrace trace already; read it directly: memtrace report {path}")


def read_snapshot(path: str | os.PathLike) -> dict[str, Any]:
    """Unpickle a ``torch.cuda.memory._dump_snapshot`` file into plain dicts (no code is run)."""
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(f"{path}: no such file; pass the pickle written by torch.cuda.memory._dump_snapshot()")
    if path.is_dir():
        raise TraceFormatError(f"{path} is a directory; pass the snapshot pickle file itself")
    try:
        f = open(path, "rb")  # streamed: the file's bytes are never all in memory beside the objects
    except OSError as exc:
        raise TraceFormatError(f"cannot read {path}: {exc.strerror or exc}; check its permissions") from None
    if path.stat().st_size == 0:
        f.close()
        raise TraceFormatError(f"{path} is empty; dump the snapshot again with torch.cuda.memory._dump_snapshot()")
    try:
        with f:
            snapshot = _SnapshotUnpickler(f).load()
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
        OSError,
    ) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceFormatError(
            f"{path} is not a readable PyTorch snapshot pickle ({why}); dump it again with "
            "torch.cuda.memory._dump_snapshot()"
        ) from None
    return snapshot


def traces_from_snapshot_file(path: str | os.PathLike, *, device: int | None = None) -> list[Trace]:
    """Read a snapshot pickle and convert it, one trace per device (``importers.torch_snapshot``)."""
    from memtrace.importers.snapshot import traces_from_snapshot

    with gc_paused():
        return _traces_from_snapshot_file(path, device, traces_from_snapshot)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a snapshot is unpickled and converted.

    A snapshot is millions of dicts and lists without a cycle (reference counting frees them); with
    the collector on, every full collection walks all of them again: a 1M-entry snapshot unpickled
    in 2.8 s of CPU with it, 0.9 s without.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _traces_from_snapshot_file(path, device, traces_from_snapshot) -> list[Trace]:
    snapshot = read_snapshot(path)
    traces = traces_from_snapshot(snapshot, device=device, source=str(path))
    del snapshot
    for t in traces:
        t.path = str(path)
        for note in t.notes:
            if note.level == "warning":
                print(f"memtrace: warning: {path} ({_where(t)}): {note.text}", file=sys.stderr)
    return traces


def _where(t: Trace) -> str:
    return f"cuda:{t.process.device_index}" if t.process.device_index is not None else t.label


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
    from memtrace.packed import compression
    from memtrace.store import SQLITE_MAGIC, load_run

    p = Path(path)
    if not p.exists():
        raise TraceFormatError(f"{p}: no such file or directory; pass a run directory, a .memtrace file or a snapshot")
    if p.is_dir():
        return _said(_profiler_run(p) or load_run(p, each=each))
    if is_profiler_path(p):
        from memtrace.importers.kineto import traces_from_kineto_file

        return Run(path=str(p), traces=traces_from_kineto_file(p, device=device))
    if is_pickle_path(p) or allow_pickle:
        try:
            with open(p, "rb") as f:
                head = f.read(16)
        except OSError as exc:
            raise TraceFormatError(f"cannot read {p}: {exc.strerror or exc}; check its permissions") from None
        if head == SQLITE_MAGIC or compression(head):  # a trace misnamed .pkl: read it as what it is
            return _said(load_run(p))
        traces = traces_from_snapshot_file(p, device=device)
        warn_pickle(p)
        return Run(path=str(p), traces=traces)
    return _said(load_run(p))


def _profiler_run(folder: Path) -> Run | None:
    """A folder of torch.profiler traces and no memtrace trace (vLLM's ``torch_profiler_dir``: one
    ``[prefix_]dp0_pp0_tp0_dcp0_ep0_rank<N>.<ns>.pt.trace.json.gz`` per worker, the API server's
    ``<host>_<pid>.async_llm.<ns>.pt.trace.json.gz``) as one run; None for any other folder. Files without
    memory events (vLLM's API server allocates no tensor while profiled) are named in one warning line; when
    no file has any (recorded without ``torch_profiler_with_memory``), that is one error line. A folder that
    holds memtrace traces too is read as a run of them, and its profiler files are named as not read."""
    from memtrace.packed import is_trace_name

    files = profiler_files(folder)
    if any(is_trace_name(f.name) for f in folder.iterdir()):  # a memtrace run: the profiler reader is not imported
        if files:
            names = ", ".join(f.name for f in files)
            print(
                f"memtrace: warning: {folder}: not read: {names} (torch.profiler traces beside memtrace traces are "
                f"not one run with them; read them on their own: memtrace report {files[0]})",
                file=sys.stderr,
            )
        return None
    if not files:
        return None
    from memtrace.importers.kineto import NoMemoryEvents, traces_from_kineto_file

    traces, empty = [], []
    for f in files:
        try:
            traces += traces_from_kineto_file(f)
        except NoMemoryEvents as exc:
            empty.append((f, exc))
    if not traces:
        raise empty[0][1]
    if empty:
        names = ", ".join(f.name for f, _ in empty)
        print(
            f"memtrace: warning: {folder}: not read: {names} (no [memory] events: nothing was allocated there "
            "while profiled, or it was profiled without profile_memory)",
            file=sys.stderr,
        )
    traces.sort(key=lambda t: (t.process.rank if t.process.rank is not None else 1 << 30, t.process.pid))
    return Run(path=str(folder), traces=traces)


#: What every command says on stderr about an imported trace of these kinds (``facts["import"]["state"]``).
_STATE_WORDS = {
    "moment": "is the allocator's state at one moment (a snapshot without history): no timeline",
    "missing": "was imported without its allocator state: every peak and total is a lower bound",
}


def _said(run: Run) -> Run:
    """``run``, after one stderr line per trace that is one moment or a lower bound (the import's warning
    notes said it when the snapshot was read; a saved trace says it on every load)."""
    from memtrace import facts as F

    for t in run.traces:
        words = _STATE_WORDS.get((t.facts.get(F.IMPORT) or {}).get("state"))
        if words:
            print(f"memtrace: warning: {t.path or run.path} ({_where(t)}) {words}", file=sys.stderr)
    return run
