"""PyTorch allocated as torch counts it: the allocator's blocks, replayed from its events (pure).

The allocator's trace entries carry the *requested* size of each allocation (``quantities.ALLOCATED``).
``torch.cuda.memory_allocated()`` counts the *blocks* handed out (``quantities.ALLOCATED_BLOCKS``): the
request rounded up to 512 B, and, when the rest of the free block it was cut from is too small to be split
off, the whole free block. PyTorch's rule (``c10/cuda/CUDACachingAllocator.cpp``, ``shouldSplit``): a block
of the small pool (requests up to 1 MiB) or of an expandable segment is split when at least 512 B remain; a
block of the large pool only when more than 1 MiB remains. So a 1 MiB step can appear where a request left
less than 1 MiB of its segment free (measured on the H200: vLLM 0.34's ``load_model``).

:func:`block_sizes` replays the segments and the live blocks to find each allocation's block; the free
block an allocation is cut from runs from its address to the next live block or the end of its segment
(free neighbours are merged); an allocation still live in the final snapshot takes its block's bytes from
there (exact: on vLLM 0.34's dense start-up torch kept a 64 MiB block whole for a 48 MiB request, which
the rule above would have split). :func:`block_curve` is the curve, its baseline taken from the final snapshot's
blocks (exact) or, without one, the requested baseline rounded as torch rounds it.
"""

from __future__ import annotations

import bisect

import numpy as np
from memtrace.analysis.memory.curves import Curve, Curves
from memtrace.model import ACTION_CODE, Trace

#: torch's smallest block and rounding unit, and the largest request of the small pool (kSmallSize)
MIN_BLOCK_BYTES = 512
SMALL_BYTES = 1 << 20

_ALLOC, _FREE = ACTION_CODE["alloc"], ACTION_CODE["free_completed"]
_SEG_UP = (ACTION_CODE["segment_alloc"], ACTION_CODE["segment_map"])
_SEG_DOWN = (ACTION_CODE["segment_free"], ACTION_CODE["segment_unmap"])


def round_size(requested: np.ndarray | int) -> np.ndarray | int:
    """torch's ``round_size``: at least 512 B, rounded up to a multiple of 512 B."""
    return np.maximum(-(-np.asarray(requested, dtype=np.int64) // MIN_BLOCK_BYTES), 1) * MIN_BLOCK_BYTES


def _expandable(trace: Trace) -> bool:
    ev = trace.events["action"]
    return bool(np.isin(ev, (ACTION_CODE["segment_map"], ACTION_CODE["segment_unmap"])).any()) or any(
        s.is_expandable for s in trace.segments
    )


class _Replay:
    """The segments and live blocks of the allocator, kept as sorted starts (addresses)."""

    def __init__(self, trace: Trace, expandable: bool):
        self.expandable = expandable
        self.seg_end: dict[int, int] = {}
        self.seg_starts: list[int] = []
        self.live: dict[int, int] = {}  # block start -> block bytes
        self.live_starts: list[int] = []
        ev = trace.events
        recorded = set(ev["addr"][np.isin(ev["action"], _SEG_UP)].tolist())
        for s in trace.segments:  # segments from before recording
            if s.address not in recorded:
                self.add_segment(s.address, s.total_bytes)
        allocated = set(ev["addr"][ev["action"] == _ALLOC].tolist())
        for s in trace.segments:
            for b in s.blocks:
                if b.state.startswith("active") and b.address not in allocated:
                    self.add_block(b.address, b.size_bytes)

    def add_segment(self, start: int, size: int) -> None:
        """A new segment, or (expandable segments) pages mapped at the end of one."""
        i = bisect.bisect_right(self.seg_starts, start) - 1
        if self.expandable and i >= 0 and self.seg_end[self.seg_starts[i]] == start:
            self.seg_end[self.seg_starts[i]] = start + size
            return
        if start not in self.seg_end:
            bisect.insort(self.seg_starts, start)
        self.seg_end[start] = start + size

    def remove_segment(self, start: int, size: int) -> None:
        """A segment freed, or (expandable segments) pages unmapped at the end of one."""
        i = bisect.bisect_right(self.seg_starts, start) - 1
        if i < 0 or self.seg_end[self.seg_starts[i]] != start + size:
            return  # not a range the replay knows
        first = self.seg_starts[i]
        if first < start:
            self.seg_end[first] = start
            return
        del self.seg_end[first]
        self.seg_starts.pop(i)

    def add_block(self, start: int, size: int) -> None:
        if start not in self.live:
            bisect.insort(self.live_starts, start)
        self.live[start] = size

    def free_block(self, start: int) -> int | None:
        size = self.live.pop(start, None)
        if size is not None:
            self.live_starts.pop(bisect.bisect_left(self.live_starts, start))
        return size

    def block_for(self, addr: int, requested: int) -> int:
        """The bytes of the block an allocation of ``requested`` at ``addr`` receives."""
        size = int(round_size(requested))
        i = bisect.bisect_right(self.seg_starts, addr) - 1
        if i < 0 or self.seg_end[self.seg_starts[i]] <= addr:
            return size  # no segment known: torch's rounding alone
        end = self.seg_end[self.seg_starts[i]]
        j = bisect.bisect_right(self.live_starts, addr)
        free_end = min(end, self.live_starts[j]) if j < len(self.live_starts) else end
        remaining = free_end - addr - size
        if remaining <= 0:
            return size
        small = size <= SMALL_BYTES
        split = remaining >= MIN_BLOCK_BYTES if small or self.expandable else remaining > SMALL_BYTES
        return size if split else size + remaining


def _final_blocks(trace: Trace) -> dict[int, int]:
    """Event index of each allocation still live in the final snapshot -> its block's bytes there (exact:
    torch's own figure, whatever rule gave it)."""
    ev = trace.events
    allocs = np.flatnonzero(ev["action"] == _ALLOC)
    last = dict(zip(ev["addr"][allocs].tolist(), allocs.tolist(), strict=True))  # the last alloc at each address
    return {
        last[b.address]: b.size_bytes
        for s in trace.segments
        for b in s.blocks
        if b.state.startswith("active") and b.address in last
    }


def block_sizes(trace: Trace) -> np.ndarray:
    """The block bytes of every event that changes PyTorch allocated: + on ``alloc``, - on ``free_completed``
    (of the block freed), 0 otherwise (int64, one per event)."""
    ev = trace.events
    out = np.zeros(len(ev), dtype=np.int64)
    replay = _Replay(trace, _expandable(trace))
    up, down = set(_SEG_UP), set(_SEG_DOWN)
    relevant = np.flatnonzero(np.isin(ev["action"], (_ALLOC, _FREE, *_SEG_UP, *_SEG_DOWN)))
    actions, addrs, sizes = (
        ev["action"][relevant].tolist(),
        ev["addr"][relevant].tolist(),
        ev["size"][relevant].tolist(),
    )
    final = _final_blocks(trace)
    for k, action, addr, size in zip(relevant.tolist(), actions, addrs, sizes, strict=True):
        if action == _ALLOC:
            block = final.get(k) or replay.block_for(addr, size)
            replay.add_block(addr, block)
            out[k] = block
        elif action == _FREE:
            block = replay.free_block(addr)
            out[k] = -(block if block is not None else int(round_size(size)))
        elif action in up:
            replay.add_segment(addr, size)
        elif action in down:
            replay.remove_segment(addr, size)
    return out


def block_curve(trace: Trace, curves: Curves) -> Curve:
    """PyTorch allocated as ``torch.cuda.memory_allocated()`` counts it, after every event, on the curves' time
    axis. Its baseline is exact when the final snapshot's blocks were saved (their bytes less the recorded
    net); else the requested baseline rounded to whole 512 B (a lower bound, as that baseline is)."""
    values = np.concatenate(([0], np.cumsum(block_sizes(trace))))  # int64
    active = [b.size_bytes for s in trace.segments for b in s.blocks if b.state.startswith("active")]
    if active:
        values += sum(active) - int(values[-1])
    elif curves.baseline.allocated_bytes:
        values += int(round_size(curves.baseline.allocated_bytes))
    return Curve(curves.allocated.time_us, values)
