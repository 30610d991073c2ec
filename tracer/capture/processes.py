"""Other processes' memory on the traced device, from NVML's per-process list (the sidecar's part).

The traced process is told apart from the others by its pid, by its pids in nested PID namespaces,
as the only process listed, or (inside a container, where NVML lists host pids) by its memory.
Runs in the sidecar process: no torch, no CUDA.
"""

from __future__ import annotations

from typing import Any

#: Finding the traced process by memory when its pid is not NVML's: its NVML figure lies within
#: [reserved - MATCH_BELOW, reserved + MATCH_ABOVE] (a CUDA context, cuBLAS, NCCL on top of PyTorch's).
MATCH_BELOW = 1 << 30
MATCH_ABOVE = 8 << 30


class Others:
    """Memory of the other processes on the device, from NVML's per-process list.

    The traced process is found by its pid (or another pid of it in a nested PID namespace, from
    ``/proc/<pid>/status`` NSpid), or as the only process listed (it holds a CUDA context when the
    sidecar starts). Then others = the sum of every other process's used memory ("per-process"), or
    device used - driver reserve - ours when another process's figure is not available
    ("used-minus-ours"). When the traced process is not found (NVML lists host pids inside a
    container's PID namespace, and there are several processes), it is looked for by memory: the
    traced process sends its PyTorch reserved bytes (at start, then ``reserved N`` lines at phase
    boundaries), and the one process whose NVML figure lies within [reserved - MATCH_BELOW,
    reserved + MATCH_ABOVE] (PyTorch's segments plus a CUDA context and libraries) is taken as
    ours, by its pid from then on ("memory-matched" in the statistics). Until then, or when several
    processes match, nothing is recorded ("not-found").
    """

    def __init__(self, pynvml: Any, handle: Any, parent: int, reserve: int, hint: int | None = None):
        self.pynvml, self.handle, self.reserve = pynvml, handle, reserve
        self.hint = hint  # the traced process's latest PyTorch reserved bytes (set by the stdin thread)
        self.memory_matched: int | None = None
        self.query = getattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", None)  # absent in very old pynvml
        self.ours = _own_pids(parent)
        self.counts: dict[str, int] = {}
        self.max_processes = 0
        self.listed: set[int] = set()
        self.failed = 0

    def sample(self, used: int) -> int | None:
        """Others' bytes now, or None when not attributable."""
        if self.query is None:
            return self._count("unsupported", None)
        try:
            procs = self.query(self.handle)
        except self.pynvml.NVMLError:
            self.failed += 1
            return None
        self.max_processes = max(self.max_processes, len(procs))
        if len(self.listed) < 64:
            self.listed.update(int(p.pid) for p in procs)
        mine = [p for p in procs if int(p.pid) in self.ours]
        if not mine and len(procs) == 1:
            mine = list(procs)
        if not mine:
            mine = self._match_by_memory(procs)
        rest = [p for p in procs if p not in mine]
        if not mine:
            return self._count("not-found", None)
        if all(_used(p) is not None for p in rest):
            return self._count("per-process", sum(_used(p) for p in rest))
        own = [_used(p) for p in mine]
        if all(v is not None for v in own):
            return self._count("used-minus-ours", max(used - self.reserve - sum(own), 0))
        return self._count("not-available", None)

    def _match_by_memory(self, procs: list) -> list:
        hint = self.hint
        if hint is None:
            return []
        near = [p for p in procs if _used(p) is not None and hint - MATCH_BELOW <= _used(p) <= hint + MATCH_ABOVE]
        if len(near) != 1:
            return []
        self.memory_matched = int(near[0].pid)
        self.ours.add(self.memory_matched)
        return near

    def _count(self, method: str, value: int | None) -> int | None:
        self.counts[method] = self.counts.get(method, 0) + 1
        return value

    def stats(self) -> dict[str, Any]:
        attributed = {k: v for k, v in self.counts.items() if k in ("per-process", "used-minus-ours")}
        method = (
            max(attributed, key=attributed.get)
            if attributed
            else (max(self.counts, key=self.counts.get) if self.counts else "none")
        )
        return {
            "others_method": method,
            "others_methods": dict(self.counts),
            "others_errors": self.failed,
            "traced_pids": sorted(self.ours),
            "memory_matched_pid": self.memory_matched,
            "nvml_pids": sorted(self.listed),
            "max_processes": self.max_processes,
        }


def _used(proc: Any) -> int | None:
    v = getattr(proc, "usedGpuMemory", None)
    return int(v) if v is not None else None  # pynvml gives None for NVML_VALUE_NOT_AVAILABLE


def _own_pids(pid: int) -> set[int]:
    """``pid`` and its pids in the other PID namespaces this /proc shows (``NSpid``)."""
    pids = {pid}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    pids.update(int(x) for x in line.split()[1:])
    except (OSError, ValueError):
        pass
    return pids
