"""Real vLLM start-ups recorded on the H200 (tests/data/vllm-h200-034, -033): where they are, unpacked.

The traces are shipped xz-compressed (a start-up with Python stacks is 1-3 MB of SQLite, 80-190 KB of xz);
:meth:`Recorded.run_dir` unpacks one into a folder of its own under the system's temporary directory, once
per test process (removed when it exits: ``testdata.unpacked_dir``), and returns that run directory (the
trace alone: vLLM's log stays in tests/data). The module-level ``run_dir``, ``vllm_log`` and ``logged`` read
vLLM 0.34.0's folder; ``VLLM033`` holds vLLM 0.33.0's.
"""

from __future__ import annotations

import re
from pathlib import Path

from testdata import DATA as _DATA
from testdata import unpacked_dir


class Recorded:
    """One folder of tests/data holding a step per sub-folder: ``*.memtrace.xz`` and ``vllm.log``."""

    def __init__(self, folder: str):
        self.folder = folder
        self.data = _DATA / folder

    def run_dir(self, step: str) -> Path:
        """The run directory of ``step`` with its trace unpacked (idempotent within one process)."""
        return unpacked_dir(f"{self.folder}/{step}")

    def vllm_log(self, step: str) -> str:
        return (self.data / step / "vllm.log").read_text()

    def logged(self, step: str, pattern: str) -> str:
        """The first group of ``pattern`` in the step's vLLM log (fails loudly when vLLM did not say it)."""
        m = re.search(pattern, self.vllm_log(step))
        assert m, f"{self.data.name}/{step}: vLLM's log has no line matching {pattern!r}"
        return m.group(1)

    def torch_says(self, step: str, what: str, more: dict[str, str] | None = None) -> str:
        """A figure of torch's OutOfMemoryError in the step's vLLM log, as torch printed it ("22.00 MiB"):
        ``what`` a key of :data:`TORCH_OOM` or of ``more`` (patterns of the step's own, e.g. a process id's)."""
        return self.logged(step, {**TORCH_OOM, **(more or {})}[what])


#: A size as torch's OutOfMemoryError prints it, and the message's figures by name (``Recorded.torch_says``).
TORCH_SIZE = r"([\d.]+ [KMG]iB)"
TORCH_OOM = {
    "requested": rf"OutOfMemoryError: CUDA out of memory\. Tried to allocate {TORCH_SIZE}",
    "free": rf"OutOfMemoryError: .* of which {TORCH_SIZE} is free",
    "allowed": rf"OutOfMemoryError: .* {TORCH_SIZE} allowed;",
    "allocated": rf"OutOfMemoryError: .* Of the allocated memory {TORCH_SIZE} is allocated by PyTorch",
    "private pools": rf"OutOfMemoryError: .* with {TORCH_SIZE} allocated in private pools",
    "reserved unallocated": rf"OutOfMemoryError: .* and {TORCH_SIZE} is reserved by PyTorch but unallocated",
    "this process": rf"OutOfMemoryError: .* this process has {TORCH_SIZE} memory in use",
}


VLLM034 = Recorded("vllm-h200-034")
VLLM033 = Recorded("vllm-h200-033")
DATA = VLLM034.data
STEPS = ("moe-ext", "moe-noext", "dense-ext", "dense-noext", "small-ext")
run_dir, vllm_log, logged = VLLM034.run_dir, VLLM034.vllm_log, VLLM034.logged
