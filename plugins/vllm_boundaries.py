"""memtrace's own device-memory readings at vLLM's phase boundaries (CUDA only).

At the start and end of every vLLM phase the plugin reads what vLLM's ``MemorySnapshot`` reads —
``cudaMemGetInfo`` (free, total) and PyTorch's reserved/allocated counters — at the same instants
vLLM measures (init snapshot = end of ``init_device``; "after profiling" = end of
``determine_available_memory`` in 0.25, start of ``cudagraph_profile`` in 0.33). Reading these changes
nothing (no allocation, no ``empty_cache``, no peak reset). They are kept as
``facts["memtrace.phase_memory"]``: a list of ``{phase, edge, time_us, free_bytes, total_bytes,
reserved_bytes, allocated_bytes, reserved_peak_bytes, allocated_peak_bytes}`` (the peaks are torch's own,
since the last reset: ``facts["memtrace.peak_resets_us"]``); ``memtrace.analysis.capacity.reconcile`` uses them when a trace has no NVML
samples, and reports both when it has.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from memtrace import facts as F
from memtrace.capture import selfcost
from memtrace.capture.counters import allocator_stats, stat


def read(device: int) -> dict[str, int] | None:
    """One reading of the device, or None without an initialized CUDA."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    free, total = torch.cuda.mem_get_info(device)
    s = allocator_stats(torch, device)
    reserved, allocated = (stat(s, f"{k}_bytes.all.current", 0) for k in ("reserved", "allocated"))
    reserved_peak, allocated_peak = (stat(s, f"{k}_bytes.all.peak", 0) for k in ("reserved", "allocated"))
    return {
        "time_us": time.time_ns() // 1000,
        "free_bytes": int(free),
        "total_bytes": int(total),
        "reserved_bytes": int(reserved),
        "allocated_bytes": int(allocated),
        "reserved_peak_bytes": int(reserved_peak),
        "allocated_peak_bytes": int(allocated_peak),
    }


def record(session: Any, phase: str, edge: str) -> None:
    """Append a reading for ``phase`` at ``edge`` ("start"/"end") to the session's facts (CUDA sessions only; its time
    is memtrace's ``phase_memory`` source)."""
    if getattr(session, "history", None) is None:
        return
    with selfcost.region(selfcost.PHASE_MEMORY):
        _record(session, phase, edge)


def _record(session: Any, phase: str, edge: str) -> None:
    device = getattr(getattr(session, "process", None), "device_index", None)
    if device is None:
        return
    reading = read(device)
    if reading is None:
        return
    readings = list(session.facts.get(F.PHASE_MEMORY) or [])
    readings.append({"phase": phase, "edge": edge, **reading})
    session.set_fact(F.PHASE_MEMORY, readings)
