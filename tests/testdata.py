"""Where the real traces recorded on the H200 live, for tests that read them, and the compressed ones unpacked.

Traces are shipped xz-compressed (``*.memtrace.xz``) to keep the repository small (a start-up with Python
stacks is 1-3 MB of SQLite, 80-190 KB of xz): the vLLM 0.33/0.34 ones (``vllm034_data``), and the folders of
:data:`PACKED`, which were shipped plain before. :func:`unpacked_dir` unpacks a folder's traces into a folder
of its own under the system's temporary directory, once per test process (removed when it exits; the folder's
other files, vLLM's log say, stay in tests/data), so a test reads the same plain SQLite bytes the recorder
wrote. :func:`unpacked` maps a path under tests/data (a run folder, or a trace in one) to what the tests read:
the path itself, or its unpacked copy when its folder is one of :data:`PACKED`. The copy is shared by the
test process: a test that changes a trace copies it first (the copies are writable).
"""

from __future__ import annotations

import atexit
import lzma
import os
import shutil
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"

#: Folders of tests/data shipped plain until they were compressed (``xz -9e``) for size: the tests read them
#: unpacked (:func:`unpacked`), and :func:`real_traces` still lists their traces.
PACKED = (
    "vllm-h200/startup",
    "vllm-h200/startup-cupti",
    "vllm-h200/startup-stacks",
    "h200/startup-ws1g",
    "h200/seed-b12x-0613",
    "h200/startup-cap44g",
)

_UNPACKED = Path(tempfile.gettempdir()) / f"memtrace-tests-data-{os.getpid()}"
atexit.register(shutil.rmtree, _UNPACKED, ignore_errors=True)  # nothing left behind in /tmp


def unpacked_dir(folder: str) -> Path:
    """The ``*.memtrace.xz`` of tests/data/``folder`` unpacked into a folder of their own, named
    ``folder`` under this process's temporary root (idempotent within one process)."""
    out = _UNPACKED / folder
    if not out.is_dir():
        packed_files = sorted((DATA / folder).glob("*.memtrace.xz"))
        assert packed_files, f"{DATA / folder}: no *.memtrace.xz"
        tmp = out.with_name(f".{out.name}.partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for packed in packed_files:
            (tmp / packed.name[: -len(".xz")]).write_bytes(lzma.decompress(packed.read_bytes()))
        tmp.rename(out)
    return out


def unpacked(path: str | os.PathLike) -> Path:
    """``path`` as the tests read it: a run folder of :data:`PACKED` (or a ``.memtrace`` in one) -> its
    unpacked copy; any other path (another folder, a folder's log) is returned as it is."""
    path = Path(path)
    try:
        rel = path.resolve().relative_to(DATA).as_posix()
    except ValueError:
        return path
    for folder in PACKED:
        if rel == folder:
            return unpacked_dir(folder)
        if rel.startswith(folder + "/") and rel.endswith(".memtrace") and "/" not in rel[len(folder) + 1 :]:
            return unpacked_dir(folder) / path.name
    return path


def data_name(path: str | os.PathLike) -> str:
    """``path`` relative to tests/data, or to the unpacked copies' root: ``vllm-h200/startup/x.memtrace``."""
    path = Path(path)
    for root in (DATA, _UNPACKED):
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return str(path)


def real_traces() -> list[Path]:
    """Every real .memtrace file shipped plain under tests/data, and those of :data:`PACKED` unpacked, in a
    stable order (by their name under tests/data)."""
    paths = list(DATA.glob("**/*.memtrace")) + [p for f in PACKED for p in unpacked_dir(f).glob("*.memtrace")]
    return sorted(paths, key=lambda p: Path(data_name(p)).parts)


def analysed_rank(trace, **spec):
    """The analysed rank of one trace (``analysis.run.analyse`` of a one-trace run) under a target
    specification (``target_bytes``, ``util``, ``total_bytes``): what every output renders."""
    from memtrace.analysis.analysed.rank import TargetSpec
    from memtrace.analysis.analysed.run import analyse

    return analyse([trace], TargetSpec(**spec), path=trace.path).ranks[0]


def analysed_run(traces, **spec):
    """The analysed run of ``traces`` (one run) under a target specification."""
    from memtrace.analysis.analysed.rank import TargetSpec
    from memtrace.analysis.analysed.run import analyse

    return analyse(list(traces), TargetSpec(**spec), path=traces[0].path if traces else "")
