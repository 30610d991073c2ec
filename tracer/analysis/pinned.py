"""The memory the caching allocator cannot give back: segments holding at least one live block.

On a card that is full, PyTorch's caching allocator does not fail at once: it releases every cached
segment with no live block (``release_cached_blocks``) and retries. So what a start-up *needs* at a
moment is not the reserved curve (which, on a large card, keeps free segments cached) but the
*pinned* curve: the sizes of the segments that hold at least one live block. ``fits`` compares this
curve with smaller capacities. In tests/data/h200/startup-full, capture_model's reserved peak is
130.65 GiB of which 128.85 GiB is pinned: 1.8 GiB of cached segments a smaller card would release
rather than fail (kernel_warmup, where those runs died, has 130.29 reserved and 130.25 pinned).

Segments are tracked through ``segment_alloc``/``segment_free``; blocks through ``alloc`` /
``free_completed``, placed in the segment whose address range holds them. Blocks and segments from
before recording come from the final snapshot and from frees without a recorded allocation.
Expandable segments (``segment_map``/``segment_unmap``) are not modelled: the reserved curve is
returned for them.
"""

from __future__ import annotations

import bisect

import numpy as np

from ..model import ACTION_CODE, Trace
from .curves import Curve, Curves, all_curves
from .live import lifetimes

_ALLOC = ACTION_CODE["alloc"]
_FREE = ACTION_CODE["free_completed"]
_SEG_ALLOC = ACTION_CODE["segment_alloc"]
_SEG_FREE = ACTION_CODE["segment_free"]
_EXPANDABLE = (ACTION_CODE["segment_map"], ACTION_CODE["segment_unmap"])


class _Segments:
    """Active segments by start address, with a live-block count each."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.size: dict[int, int] = {}
        self.live: dict[int, int] = {}

    def add(self, start: int, size: int) -> None:
        if start not in self.size:
            bisect.insort(self.starts, start)
        self.size[start] = size
        self.live.setdefault(start, 0)

    def remove(self, start: int) -> None:
        if start in self.size:
            self.starts.pop(bisect.bisect_left(self.starts, start))
            del self.size[start]
            self.live.pop(start, None)

    def find(self, addr: int) -> int | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0:
            return None
        start = self.starts[i]
        return start if addr < start + self.size[start] else None


def pinned_curve(trace: Trace, curves: Curves | None = None) -> Curve:
    """Bytes of segments holding a live block, on the reserved curve's time axis (index i: after event i-1)."""
    curves = curves or all_curves(trace)
    ev = trace.events
    if len(ev) == 0 or np.isin(ev["action"], _EXPANDABLE).any():
        return curves.reserved
    actions = ev["action"].tolist()
    addrs = ev["addr"].tolist()
    sizes = ev["size"].tolist()
    segs = _Segments()
    # segments from before recording: in the final snapshot without a recorded segment_alloc, or freed
    # during recording without one
    allocated_here = {a for a, act in zip(addrs, actions, strict=True) if act == _SEG_ALLOC}
    for s in trace.segments:
        if s.address not in allocated_here:
            segs.add(s.address, s.total_bytes)
    seen: set[int] = set()
    for a, act, size in zip(addrs, actions, sizes, strict=True):
        if act == _SEG_ALLOC:
            seen.add(a)
        elif act == _SEG_FREE and a not in seen and a not in segs.size:
            segs.add(a, size)
    # blocks live before recording
    lt = lifetimes(trace)
    for addr in lt.addr[lt.alloc_pos < 0].tolist():
        s = segs.find(addr)
        if s is not None:
            segs.live[s] += 1
    pinned = sum(segs.size[s] for s, n in segs.live.items() if n > 0)
    out = np.empty(len(ev) + 1, dtype=np.int64)
    out[0] = pinned
    for i, (a, act, size) in enumerate(zip(addrs, actions, sizes, strict=True)):
        if act == _ALLOC:
            s = segs.find(a)
            if s is not None:
                segs.live[s] += 1
                if segs.live[s] == 1:
                    pinned += segs.size[s]
        elif act == _FREE:
            s = segs.find(a)
            if s is not None and segs.live[s] > 0:
                segs.live[s] -= 1
                if segs.live[s] == 0:
                    pinned -= segs.size[s]
        elif act == _SEG_ALLOC:
            segs.add(a, size)
        elif act == _SEG_FREE:
            s = segs.find(a)
            if s is not None and segs.live.get(s, 0) > 0:
                pinned -= segs.size[s]
            if s is not None:
                segs.remove(s)
        out[i + 1] = pinned
    return Curve(curves.reserved.time_us, np.minimum(out, curves.reserved.bytes))
