"""Where a command writes: one output-path policy for every command that writes a file or a folder.

- **Default names** come from the run's own name (``run_name``): a run directory's name (``.`` and
  ``..`` resolved), a trace file's stem; ``<name><suffix>`` in the current directory.
- **An input is never an output**, even with ``--force``: the output may not be an input, lie inside
  an input file, or be a trace file inside an input run folder.
- **Nothing is replaced without ``--force``**, and a directory is never replaced by a file.
- **The suffix matches the format**: a command refuses a name whose suffix its format cannot write.
- **No folder is created silently**: the parent folder must exist (a bundle's own folder is created,
  its parent must exist).
- **Writes are atomic**: :func:`atomic_write` writes beside the target and renames, so a failed
  write never leaves half a file and never destroys the old one.

Every refusal is a :class:`~memtrace.errors.UsageError`: one line, exit code 2.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from memtrace.errors import UsageError
from memtrace.packed import is_trace_name, strip_trace_suffix

#: A profiler trace's suffixes, longest first (``importers.kineto`` reads them).
_PROFILER_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json.xz", ".pt.trace.json", ".json.gz", ".json.xz", ".json")


def run_name(run_path: str | os.PathLike) -> str:
    """The name outputs are called after: ``runs/startup/`` -> ``startup``, ``x.memtrace`` (or
    ``x.memtrace.xz``) -> ``x``, ``w.rank0.1.pt.trace.json.gz`` -> ``w.rank0.1``, ``.`` -> the current
    directory's name."""
    p = Path(run_path)
    name = p.resolve().name if p.name in ("", ".", "..") else p.name
    stripped = strip_trace_suffix(name)
    if stripped == name:
        for suffix in (".pickle", ".pkl", *_PROFILER_SUFFIXES):
            if name.lower().endswith(suffix):
                stripped = name[: -len(suffix)]
                break
    return stripped or "run"


def _inside(path: Path, parent: Path) -> bool:
    try:
        path.relative_to(parent)
        return True
    except ValueError:
        return False


def _check_not_input(out: Path, inputs: Iterable[str | os.PathLike]) -> None:
    """An output may not be an input, lie inside an input file, or join a run folder as a trace.

    Other files inside a run folder are fine (``cd RUN && memtrace plot .`` writes ``RUN-timeline.png``
    there): a run is its ``*.memtrace`` files (plain or compressed), and nothing else in its folder is read.
    """
    resolved = out.resolve()
    expanded: list[str | os.PathLike] = []
    for raw in inputs:  # a run folder's traces are inputs too
        expanded.append(raw)
        if Path(raw).is_dir():
            try:
                expanded += [p for p in Path(raw).iterdir() if is_trace_name(p.name)]
            except OSError:
                pass  # the loader says why the folder cannot be read
    for raw in expanded:
        src = Path(raw).resolve()
        if resolved == src:
            raise UsageError(f"{out} is the input {raw}; an input is never an output, choose another name with -o")
        if _inside(resolved, src) and (src.is_file() or is_trace_name(resolved.name)):
            raise UsageError(f"{out} lies inside the input {raw}; choose another name with -o")
        if src.is_file() and _inside(src, resolved) and out.exists() and out.is_dir():
            raise UsageError(f"{out} holds the input {raw}; choose another output with -o")


def _check_parent(out: Path) -> None:
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.exists():
        raise UsageError(f"cannot write {out}: folder {parent} does not exist; create it first")
    if not parent.is_dir():
        raise UsageError(f"cannot write {out}: {parent} is not a folder")
    _check_writable(parent, f"cannot write {out}: folder {parent}")


def _check_writable(folder: Path, what: str) -> None:
    """UsageError unless a file can be created in ``folder``: tried with a nameless temporary file, since
    ``os.access`` answers yes to root for /proc and /sys, where nothing can be created."""
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{what} is not writable; choose another with -o")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError:
        raise UsageError(f"{what} is not writable; choose another with -o") from None


def output_file(
    run_path: str | os.PathLike,
    output: str | os.PathLike | None,
    *,
    default_suffix: str,
    suffixes: tuple[str, ...],
    force: bool,
    inputs: Iterable[str | os.PathLike] = (),
) -> Path:
    """The file to write, checked against the policy above.

    Args:
        run_path: the run the output describes (its name makes the default name).
        output: ``-o`` as given, or None for ``<run name><default_suffix>`` here.
        default_suffix: e.g. ``-timeline.png``.
        suffixes: the endings this format can write (``.png``, ``.svg``...); matched case-insensitively.
        force: replace an existing file.
        inputs: every path the command reads (the run itself is always included).
    """
    out = Path(output) if output is not None else Path(run_name(run_path) + default_suffix)
    if str(output or "x").strip() == "":
        raise UsageError("-o was given an empty name")
    _check_not_input(out, [run_path, *inputs])
    if out.is_dir():
        raise UsageError(f"{out} is a directory; give a file name with -o")
    name = out.name.lower()
    if not any(name.endswith(s.lower()) for s in suffixes):
        raise UsageError(f"cannot write {out.name}: this format writes {' or '.join(suffixes)} files")
    if out.exists() and not force:
        raise UsageError(f"{out} exists; pass --force to replace it or -o to choose another file")
    _check_parent(out)
    return out


def output_dir(
    run_path: str | os.PathLike,
    output: str | os.PathLike | None,
    *,
    default_suffix: str,
    files: tuple[str, ...],
    force: bool,
    inputs: Iterable[str | os.PathLike] = (),
) -> Path:
    """A folder to write ``files`` into (not created here: call :func:`make_dir` once all else passed)."""
    out = Path(output) if output is not None else Path(run_name(run_path) + default_suffix)
    _check_not_input(out, [run_path, *inputs])
    for f in files:
        _check_not_input(out / f, [run_path, *inputs])
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory; choose another with -o")
    clash = [f for f in files if (out / f).exists()]
    if clash and not force:
        raise UsageError(f"{out} already holds {', '.join(clash)}; choose another directory with -o or pass --force")
    if out.exists():
        _check_writable(out, f"cannot write into {out}: it")
    else:
        _check_parent(out)
    return out


def make_dir(out: Path) -> None:
    """Create the bundle's folder (its parent exists: :func:`output_dir` checked it)."""
    try:
        out.mkdir(exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {out}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def atomic_write(out: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``out``; on success it replaces ``out``, on failure it vanishes.

    An OSError while writing (disk full, permission) becomes one UsageError line.
    """
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.tmp{out.suffix}")  # the suffix picks the format
    try:
        yield tmp
        os.replace(tmp, out)
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
