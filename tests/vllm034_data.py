"""The real vLLM 0.34.0 start-ups recorded on the H200 (tests/data/vllm-h200-034): where they are, unpacked.

The traces are shipped xz-compressed (a start-up with Python stacks is 1-3 MB of SQLite, 80-190 KB of xz);
:func:`run_dir` unpacks one into a folder of its own under the system's temporary directory, once per
test process (removed when it exits), and returns that run directory (the trace alone: vLLM's log stays in tests/data).
"""

from __future__ import annotations

import atexit
import lzma
import os
import re
import shutil
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "vllm-h200-034"
STEPS = ("moe-ext", "moe-noext", "dense-ext", "dense-noext", "small-ext")
_UNPACKED = Path(tempfile.gettempdir()) / f"memtrace-tests-vllm034-{os.getpid()}"
atexit.register(shutil.rmtree, _UNPACKED, ignore_errors=True)  # nothing left behind in /tmp


def run_dir(step: str) -> Path:
    """The run directory of ``step`` with its trace unpacked (idempotent within one process)."""
    out = _UNPACKED / step
    if not out.is_dir():
        tmp = _UNPACKED / f".{step}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for packed in sorted((DATA / step).glob("*.memtrace.xz")):
            (tmp / packed.name[: -len(".xz")]).write_bytes(lzma.decompress(packed.read_bytes()))
        tmp.rename(out)
    return out


def vllm_log(step: str) -> str:
    return (DATA / step / "vllm.log").read_text()


def logged(step: str, pattern: str) -> str:
    """The first group of ``pattern`` in the step's vLLM log (the test fails loudly when vLLM did not say it)."""
    m = re.search(pattern, vllm_log(step))
    assert m, f"{step}: vLLM's log has no line matching {pattern!r}"
    return m.group(1)
