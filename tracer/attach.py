"""A run's traces compressed for attaching to an upstream issue (``memtrace issue --attach-trace``).

Each trace file of the run is written beside the bundle as ``<name>.memtrace.xz`` (stdlib ``lzma``): a
``.memtrace`` is compressed as it is, byte for byte; a trace already compressed is copied; a trace read
from anything else (an imported PyTorch snapshot) is first saved as a ``.memtrace``, so that no pickle is
ever attached. Every memtrace reader opens ``.memtrace.xz`` directly.
"""

from __future__ import annotations

import lzma
import shutil
import tempfile
from pathlib import Path

from memtrace.model import Trace

_COMPRESSED = (".memtrace.xz", ".memtrace.gz")


def attached_name(trace: Trace) -> str:
    """The name of ``trace``'s attachment: ``vm-pid552.memtrace.xz`` (``.gz`` kept when it came so)."""
    name = Path(trace.path).name if trace.path else f"{trace.label.replace(' ', '')}.memtrace"
    if name.endswith(_COMPRESSED):
        return name
    stem = name[: -len(".memtrace")] if name.endswith(".memtrace") else Path(name).stem
    return f"{stem}.memtrace.xz"


def _compress(src: Path, dst: Path) -> None:
    with open(src, "rb") as f, lzma.open(dst, "wb", preset=6) as out:
        shutil.copyfileobj(f, out, 1 << 20)


def write_attachment(trace: Trace, dst: Path) -> None:
    """Write ``trace`` compressed to ``dst`` (see the module docstring)."""
    from memtrace.store import save_trace

    src = Path(trace.path) if trace.path else None
    if src is not None and src.name.endswith(_COMPRESSED) and src.is_file():
        shutil.copyfile(src, dst)
    elif src is not None and src.suffix == ".memtrace" and src.is_file():
        _compress(src, dst)
    else:
        with tempfile.TemporaryDirectory(prefix="memtrace-attach-") as tmp:
            saved = save_trace(trace, Path(tmp) / "trace.memtrace")
            _compress(saved, dst)
