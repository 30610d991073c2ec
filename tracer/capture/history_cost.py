"""What PyTorch's allocator history costs the program, estimated from a short calibration at start.

Recording the history is PyTorch's own work (each allocation's Python stack gathered inside
``malloc``), invisible to memtrace's clocks. Before recording starts, :func:`calibrate` times the same
small allocation and free, ``n`` times, with the history off and on (memtrace's settings: context
"alloc", the session's stacks), at the caller's stack depth and ``EXTRA_DEPTH`` frames deeper, in
alternating rounds; the medians give a cost per allocation at depth ``depth`` and a cost per extra
frame. The analysis multiplies them by the allocations the trace recorded and their stacks' depths
(:mod:`memtrace.analysis.analysed.self_cost`).

The calibration allocates one small block: if that made PyTorch reserve a segment, the segment is
released again (``empty_cache``) so that the trace starts from the allocator state vLLM left.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

#: allocations per timed loop: 4 loops a round, 3 rounds. 200 a loop cost 7.5-16.3 ms of vLLM's thread on the H100
#: (``calibration`` in ``tests/data/vllm-h100-034-cost``) to estimate 2.4-4.8 ms of history recording; 50 cost a quarter
#: of that, and a loop of 50 still lasts ~100 us, far above the clock's resolution
N_ALLOCS = 50
ROUNDS = 3
EXTRA_DEPTH = 40
BLOCK_BYTES = 512


def _depth() -> int:
    frame, n = sys._getframe(1), 0
    while frame is not None:
        n += 1
        frame = frame.f_back
    return n


def _loop(torch: Any, device: int, n: int, extra: int) -> int:
    """ns for ``n`` allocations and frees, ``extra`` frames below the caller."""
    if extra > 0:
        return _loop(torch, device, n, extra - 1)
    empty, dtype = torch.empty, torch.uint8
    t0 = time.perf_counter_ns()
    for _ in range(n):
        x = empty(BLOCK_BYTES, dtype=dtype, device=device)
        del x
    return time.perf_counter_ns() - t0


def calibrate(torch: Any, device: int, record_on: Callable[[], None], record_off: Callable[[], None]) -> dict[str, Any]:
    """Time allocations without and with the history; returns the ``history`` part of the self-cost fact.

    ``record_on``/``record_off`` start and stop the history exactly as the session will (both clear it).
    """
    reserved0 = int(torch.cuda.memory_reserved(device))
    _loop(torch, device, 1, 0)  # the block exists before timing starts
    depth = _depth() + 1  # Python frames of a shallow allocation: _loop and everything above it
    shallow, deep = [], []
    for _ in range(ROUNDS):
        off = (_loop(torch, device, N_ALLOCS, 0), _loop(torch, device, N_ALLOCS, EXTRA_DEPTH))
        record_on()
        try:
            on = (_loop(torch, device, N_ALLOCS, 0), _loop(torch, device, N_ALLOCS, EXTRA_DEPTH))
        finally:
            record_off()
        shallow.append((on[0] - off[0]) / N_ALLOCS)
        deep.append((on[1] - off[1]) / N_ALLOCS)
    released = False
    if int(torch.cuda.memory_reserved(device)) > reserved0:
        torch.cuda.empty_cache()
        released = True
    per_alloc = max(0.0, statistics.median(shallow))
    per_frame = max(0.0, (statistics.median(deep) - statistics.median(shallow)) / EXTRA_DEPTH)
    return {
        "measured": True,
        "per_alloc_ns": round(per_alloc, 1),
        "per_frame_ns": round(per_frame, 2),
        "depth": depth,
        "allocs": N_ALLOCS,
        "rounds": ROUNDS,
        "extra_depth": EXTRA_DEPTH,
        "shallow_ns": [round(x, 1) for x in shallow],
        "deep_ns": [round(x, 1) for x in deep],
        "released_segment": released,
    }


def not_measured(why: str) -> dict[str, Any]:
    """The ``history`` part of the fact when there is no allocator history to calibrate."""
    return {"measured": False, "why": why}
