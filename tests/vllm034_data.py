"""Real vLLM start-ups recorded on the H200 (tests/data/vllm-h200-034, -033): where they are, unpacked.

The traces are shipped xz-compressed (a start-up with Python stacks is 1-3 MB of SQLite, 80-190 KB of xz);
:meth:`Recorded.run_dir` unpacks one into a folder of its own under the system's temporary directory, once
per test process (removed when it exits), and returns that run directory (the trace alone: vLLM's log stays
in tests/data). The module-level ``run_dir``, ``vllm_log`` and ``logged`` read vLLM 0.34.0's folder;
``VLLM033`` holds vLLM 0.33.0's.
"""

from __future__ import annotations

import atexit
import lzma
import os
import re
import shutil
import tempfile
from pathlib import Path

_UNPACKED = Path(tempfile.gettempdir()) / f"memtrace-tests-vllm-h200-{os.getpid()}"
atexit.register(shutil.rmtree, _UNPACKED, ignore_errors=True)  # nothing left behind in /tmp


class Recorded:
    """One folder of tests/data holding a step per sub-folder: ``*.memtrace.xz`` and ``vllm.log``."""

    def __init__(self, folder: str):
        self.data = Path(__file__).resolve().parent / "data" / folder
        self._unpacked = _UNPACKED / folder

    def run_dir(self, step: str) -> Path:
        """The run directory of ``step`` with its trace unpacked (idempotent within one process)."""
        out = self._unpacked / step
        if not out.is_dir():
            packed_files = sorted((self.data / step).glob("*.memtrace.xz"))
            assert packed_files, f"{self.data / step}: no *.memtrace.xz"
            tmp = self._unpacked / f".{step}.partial"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for packed in packed_files:
                (tmp / packed.name[: -len(".xz")]).write_bytes(lzma.decompress(packed.read_bytes()))
            tmp.rename(out)
        return out

    def vllm_log(self, step: str) -> str:
        return (self.data / step / "vllm.log").read_text()

    def logged(self, step: str, pattern: str) -> str:
        """The first group of ``pattern`` in the step's vLLM log (fails loudly when vLLM did not say it)."""
        m = re.search(pattern, self.vllm_log(step))
        assert m, f"{self.data.name}/{step}: vLLM's log has no line matching {pattern!r}"
        return m.group(1)


VLLM034 = Recorded("vllm-h200-034")
VLLM033 = Recorded("vllm-h200-033")
DATA = VLLM034.data
STEPS = ("moe-ext", "moe-noext", "dense-ext", "dense-noext", "small-ext")
run_dir, vllm_log, logged = VLLM034.run_dir, VLLM034.vllm_log, VLLM034.logged
