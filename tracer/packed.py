"""Compressed traces: which file names are traces, and reading an ``.xz``/``.gz`` one through a temporary copy.

Users compress traces to attach them to issues (a start-up with stacks is 1-3 MB of SQLite, 80-190 KB of
xz), and the shipped vLLM 0.33/0.34 traces are ``*.memtrace.xz``. SQLite reads only a plain file, so
:func:`unpacked` decompresses one (stdlib ``lzma``/``gzip``, streamed) into the system's temporary folder
and removes it once the trace is read. A compressed file is known by its content (the xz or gzip magic),
not only its name. A truncated or corrupt archive is one :class:`~memtrace.errors.TraceFormatError` line.
"""

from __future__ import annotations

import contextlib
import gzip
import lzma
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from memtrace.errors import TraceFormatError

SUFFIX = ".memtrace"
#: A trace's name, plain or compressed.
TRACE_SUFFIXES = (SUFFIX, SUFFIX + ".xz", SUFFIX + ".gz")
XZ_MAGIC = b"\xfd7zXZ\x00"
GZIP_MAGIC = b"\x1f\x8b"


def is_trace_name(name: str) -> bool:
    """True for ``x.memtrace``, ``x.memtrace.xz`` and ``x.memtrace.gz``."""
    return name.endswith(TRACE_SUFFIXES)


def strip_trace_suffix(name: str) -> str:
    """``x.memtrace.xz`` -> ``x``; a name without a trace suffix is returned as it is."""
    for suffix in sorted(TRACE_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def compression(head: bytes) -> str | None:
    """``"xz"`` or ``"gz"`` for a file starting with ``head``, None for anything else."""
    if head.startswith(XZ_MAGIC):
        return "xz"
    if head.startswith(GZIP_MAGIC):
        return "gz"
    return None


def _opener(kind: str):
    return lzma.open if kind == "xz" else gzip.open


@contextlib.contextmanager
def unpacked(path: Path, kind: str) -> Iterator[Path]:
    """A plain copy of the compressed trace ``path`` in the temporary folder, removed on exit."""
    fd, tmp = tempfile.mkstemp(prefix=f".{strip_trace_suffix(path.name)}-", suffix=SUFFIX)
    try:
        _decompress(path, kind, fd)
        yield Path(tmp)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _decompress(path: Path, kind: str, fd: int) -> None:
    try:
        with os.fdopen(fd, "wb") as out, _opener(kind)(path, "rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)
    except (lzma.LZMAError, gzip.BadGzipFile, zlib.error, EOFError) as exc:
        raise TraceFormatError(
            f"{path} is a corrupt or truncated {kind} archive ({exc or type(exc).__name__}); "
            "compress the trace again or restore a copy"
        ) from None
    except OSError as exc:
        raise TraceFormatError(f"cannot unpack {path}: {exc.strerror or exc}") from None
