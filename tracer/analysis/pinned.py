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
_MAX_ROUNDS = 64


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
    """Bytes of segments holding a live block, on the reserved curve's time axis (index i: after event i-1).

    Vectorised (:func:`_pinned_columns`); the event-at-a-time :func:`_pinned_loop` gives the same curve
    and is kept for traces whose segment events do not alternate alloc/free at each address.
    """
    curves = curves or all_curves(trace)
    ev = trace.events
    if len(ev) == 0 or np.isin(ev["action"], _EXPANDABLE).any():
        return curves.reserved
    out = _pinned_columns(trace)
    if out is None:
        return _pinned_loop(trace, curves)
    return Curve(curves.reserved.time_us, np.minimum(out, curves.reserved.bytes))


def _instances(trace: Trace) -> tuple[np.ndarray, ...] | None:
    """Every segment's life: (start, size, open, close) in doubled positions (event i at 2i+1; before
    recording -1, never closed 2n+1), sorted by (start, open); None when an address's segment events
    do not alternate (the loop then decides)."""
    ev = trace.events
    n = len(ev)
    action = ev["action"]
    addr = ev["addr"].astype(np.int64)
    seg_pos = np.flatnonzero((action == _SEG_ALLOC) | (action == _SEG_FREE))
    seg_addr, seg_is_alloc = addr[seg_pos], action[seg_pos] == _SEG_ALLOC
    allocated_here = set(seg_addr[seg_is_alloc].tolist())
    initial = {s.address: s.total_bytes for s in trace.segments if s.address not in allocated_here}
    order = np.lexsort((seg_pos, seg_addr))
    seg_pos, seg_addr, seg_is_alloc = seg_pos[order], seg_addr[order], seg_is_alloc[order]
    first = np.ones(len(seg_pos), dtype=bool)
    first[1:] = seg_addr[1:] != seg_addr[:-1]
    # a segment_free first at an address with no segment_alloc before it: a segment from before recording
    for a, p in zip(seg_addr[first & ~seg_is_alloc].tolist(), seg_pos[first & ~seg_is_alloc].tolist(), strict=True):
        initial.setdefault(a, int(ev["size"][p]))
    rank = np.arange(len(seg_pos)) - np.maximum.accumulate(np.where(first, np.arange(len(seg_pos)), 0))
    init_active = np.isin(seg_addr, np.array(list(initial), dtype=np.int64))
    if not np.array_equal(seg_is_alloc, (rank + init_active) % 2 == 0):
        return None
    # opens: every segment_alloc, and each initial segment; a close is the next event at its address
    last = np.append(first[1:], True)  # the last segment event at its address: never closed after it
    nxt = np.where(last, n, np.append(seg_pos[1:], n))
    a_idx = np.flatnonzero(seg_is_alloc)
    i_addr = np.array(list(initial), dtype=np.int64)
    i_size = np.array(list(initial.values()), dtype=np.int64)
    # an initial segment closes at its address's first event (a free), if any
    i_first = np.minimum(np.searchsorted(seg_addr, i_addr), len(seg_addr))
    at = np.append(seg_addr, -1)[i_first] == i_addr
    i_close = np.where(at, np.append(seg_pos, n)[i_first], n)
    start = np.concatenate((seg_addr[a_idx], i_addr))
    size = np.concatenate((ev["size"][seg_pos[a_idx]].astype(np.int64), i_size))
    opened = np.concatenate((2 * seg_pos[a_idx] + 1, np.full(len(i_addr), -1, np.int64)))
    closed = 2 * np.concatenate((nxt[a_idx], i_close)).astype(np.int64) + 1
    o = np.lexsort((opened, start))
    return start[o], size[o], opened[o], closed[o]


def _find(inst: tuple[np.ndarray, ...], addr: np.ndarray, q: np.ndarray) -> np.ndarray | None:
    """For each (address, doubled position): the instance ``_Segments.find`` returns then (the active
    segment with the largest start at or below the address, if the address lies in it), -1 for none.
    One round per closed segment passed on the way down; None after ``_MAX_ROUNDS`` (the loop decides)."""
    start, size, opened, closed = inst
    starts, group = np.unique(start, return_inverse=True)
    span = int(closed.max(initial=0)) + 3
    key = group.astype(np.int64) * span + (opened + 1)
    out = np.full(len(addr), -1, dtype=np.int64)
    j = np.searchsorted(starts, addr, side="right") - 1
    todo = np.flatnonzero(j >= 0)
    for _ in range(_MAX_ROUNDS):
        if not len(todo):
            return out
        jt = j[todo]
        k = np.searchsorted(key, jt * span + q[todo] + 1, side="left") - 1  # the last opened before q
        kc = np.maximum(k, 0)
        active = (k >= 0) & (group[kc] == jt) & (closed[kc] > q[todo])
        hit = todo[active]
        out[hit] = np.where(addr[hit] < start[kc[active]] + size[kc[active]], kc[active], -1)
        j[todo] -= 1
        todo = todo[~active & (j[todo] >= 0)]
    return None if len(todo) else out


def _pinned_columns(trace: Trace) -> np.ndarray | None:
    """The pinned bytes after every event (index 0: before the first), or None (see :func:`_instances`)."""
    inst = _instances(trace)
    if inst is None:
        return None
    start, size, opened, closed = inst
    ev = trace.events
    n = len(ev)
    action = ev["action"]
    lt = lifetimes(trace)
    before = lt.addr[lt.alloc_pos < 0]
    pos = np.flatnonzero((action == _ALLOC) | (action == _FREE))
    k0 = _find(inst, before, np.zeros(len(before), np.int64))
    k = _find(inst, ev["addr"][pos].astype(np.int64), 2 * pos + 1)
    if k0 is None or k is None:
        return None
    c0 = np.bincount(k0 + 1, minlength=len(start) + 1)[1:]
    pos, k = pos[k >= 0], k[k >= 0]
    o = np.lexsort((pos, k))
    pos, k = pos[o], k[o]
    del o, k0
    step = np.where(action[pos] == _ALLOC, 1, -1).astype(np.int32)
    # per instance, the live-block count floored at 0 (a free of an empty segment is ignored):
    # S = c0 + running sum, live = S - min(0, running min of S); groups kept apart by an offset
    csum = np.cumsum(step, dtype=np.int64)
    grp_first = np.ones(len(k), dtype=bool)
    grp_first[1:] = k[1:] != k[:-1]
    base = np.maximum.accumulate(np.where(grp_first, np.arange(len(k)), 0))
    s_walk = c0[k] + csum - (csum[base] - step[base])
    del csum, base, step
    big = 2 * (len(k) + int(c0.max(initial=0))) + 4
    run_min = np.minimum.accumulate(s_walk - k * big) + k * big
    np.minimum(run_min, 0, out=run_min)
    live = s_walk - run_min
    del s_walk, run_min
    prev = np.where(grp_first, c0[k], np.append(0, live[:-1]))
    delta = np.zeros(n + 1, dtype=np.int64)  # delta[i + 1]: the change made by event i
    gain = np.where((prev == 0) & (live > 0), size[k], 0) - np.where((prev > 0) & (live == 0), size[k], 0)
    delta[pos + 1] = gain  # one event per position
    del gain, prev, pos
    # at a segment's free: its bytes go if it still held a live block
    grp_last = np.append(grp_first[1:], True)
    last_live = c0.copy()
    last_live[k[grp_last]] = live[grp_last]
    shut = (closed < 2 * n + 1) & (last_live > 0)
    delta[(closed[shut] - 1) // 2 + 1] -= size[shut]  # one free closes one segment
    # segments opened pinned: initial ones with a live block count from the start
    delta[0] = int(size[(opened < 0) & (c0 > 0)].sum())
    return np.cumsum(delta)


def _pinned_loop(trace: Trace, curves: Curves) -> Curve:
    """The reference: one event at a time (for traces whose segment events do not alternate per address)."""
    ev = trace.events
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
