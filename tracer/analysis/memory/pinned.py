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
returned for them, and for a trace that names no segment its blocks could be placed in (a torch.profiler
trace, whose segments are made up from its 'Total Reserved'; a history without segment events or state).

The segment events (tens of thousands) are replayed one by one (:class:`_History`); the block events
(millions) are placed and counted with numpy in windows of events, with 32-bit indexes, so that 10M events need a
few hundred MiB beyond the trace. The event-at-a-time reference is ``pinned_loop`` in tests/references.py.
"""

from __future__ import annotations

import bisect

import numpy as np
from memtrace.analysis.holders.live import Lifetimes, lifetimes
from memtrace.analysis.memory.curves import Curve, Curves
from memtrace.model import ACTION_CODE, Trace

_ALLOC = ACTION_CODE["alloc"]
_FREE = ACTION_CODE["free_completed"]
_SEG_ALLOC = ACTION_CODE["segment_alloc"]
_SEG_FREE = ACTION_CODE["segment_free"]
_EXPANDABLE = (ACTION_CODE["segment_map"], ACTION_CODE["segment_unmap"])
_WINDOW = 1 << 16  # events per numpy step: temporaries stay small, and so do the rounds of _Pieces.find


def pinned_curve(trace: Trace, curves: Curves, lt: Lifetimes | None = None) -> Curve:
    """Bytes of segments holding a live block, on the reserved curve's time axis (index i: after event i-1).

    Vectorised (:func:`_pinned_columns`); the event-at-a-time reference (tests/references.py) gives the same curve.
    """
    ev = trace.events
    if len(ev) == 0 or np.isin(ev["action"], _EXPANDABLE).any() or not _places_blocks(trace):
        return curves.reserved
    out = _pinned_columns(trace, lt if lt is not None else lifetimes(trace))
    return Curve(curves.reserved.time_us, np.minimum(out, curves.reserved.bytes, out=out))


def _places_blocks(trace: Trace) -> bool:
    """Whether ``trace`` names segments that its blocks' addresses can be placed in: recorded segment events
    or a final state, and not the made-up segments of a profiler trace (``facts["import"]["state"]``
    "totals": only its running totals are known)."""
    from memtrace import facts as F

    if (trace.facts.get(F.IMPORT) or {}).get("state") == "totals":
        return False
    return bool(trace.segments) or bool(np.isin(trace.events["action"], (_SEG_ALLOC, _SEG_FREE)).any())


class _History:
    """The segments' lives as the event-at-a-time reference sees them, in pieces of one size each.

    Positions are doubled (event i at 2i+1, before recording -1, never 2n+1). A ``segment_alloc`` at
    the start of an active segment gives it a new size and keeps its blocks: a new piece of the same
    chain (the loop's segment). A ``segment_free`` removes the active segment holding its address."""

    def __init__(self, never: int) -> None:
        self.active: list[int] = []  # the active segments' starts, sorted
        self.piece: dict[int, int] = {}  # active start -> its current piece
        self.start: list[int] = []
        self.size: list[int] = []
        self.opened: list[int] = []
        self.closed: list[int] = []
        self.chain: list[int] = []
        self.chain_closed: list[int] = []  # the segment_free that removed each chain
        self.never = never

    def add(self, start: int, size: int, at: int) -> None:
        k = self.piece.get(start)
        if k is not None and self.opened[k] == at:  # added again before anything could see it
            self.size[k] = size
        else:
            if k is None:
                chain = len(self.chain_closed)
                self.chain_closed.append(self.never)
                bisect.insort(self.active, start)
            else:
                chain, self.closed[k] = self.chain[k], at
            self.piece[start] = len(self.start)
            for col, v in zip(self._cols(), (start, size, at, self.never, chain), strict=True):
                col.append(v)

    def free(self, addr: int, at: int) -> None:
        """The active segment with the largest start at or below ``addr`` goes, if ``addr`` lies in it."""
        i = bisect.bisect_right(self.active, addr) - 1
        if i >= 0 and addr < self.active[i] + self.size[self.piece[self.active[i]]]:
            k = self.piece.pop(self.active.pop(i))
            self.closed[k] = self.chain_closed[self.chain[k]] = at

    def _cols(self) -> tuple[list[int], ...]:
        return self.start, self.size, self.opened, self.closed, self.chain


def _history(trace: Trace) -> _History:
    """Replay the segment events (and the segments from before recording) as the loop does."""
    ev = trace.events
    action = ev["action"]
    seg_pos = np.flatnonzero((action == _SEG_ALLOC) | (action == _SEG_FREE))
    acts, addrs, sizes = (ev[c][seg_pos].tolist() for c in ("action", "addr", "size"))
    h = _History(2 * len(ev) + 1)
    allocated_here = {a for a, act in zip(addrs, acts, strict=True) if act == _SEG_ALLOC}
    for s in trace.segments:
        if s.address not in allocated_here:
            h.add(s.address, s.total_bytes, -1)
    seen: set[int] = set()
    for a, act, size in zip(addrs, acts, sizes, strict=True):
        if act == _SEG_ALLOC:
            seen.add(a)
        elif a not in seen and a not in h.piece:  # freed, never allocated: from before recording
            h.add(a, size, -1)
    for p, a, act, size in zip(seg_pos.tolist(), addrs, acts, sizes, strict=True):
        if act == _SEG_ALLOC:
            h.add(a, size, 2 * p + 1)
        else:
            h.free(a, 2 * p + 1)
    return h


class _Pieces:
    """A history's pieces as arrays sorted by (start, opened), for :meth:`find`."""

    def __init__(self, h: _History) -> None:
        start, size, opened, closed, chain = (np.array(c, dtype=np.int64) for c in h._cols())
        o = np.lexsort((opened, start))
        self.start, self.size, self.opened, self.closed = start[o], size[o], opened[o], closed[o]
        self.chain = chain[o].astype(np.int32)
        self.chain_closed = np.array(h.chain_closed, dtype=np.int64)
        self.span = h.never + 3  # above every doubled position + 1

    def find(self, addr: np.ndarray, q: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """For each (address, doubled position ``lo < q < hi``): the piece ``_History.free`` finds then
        (the active segment with the largest start at or below the address, if the address lies in it),
        -1 for none.

        Only the pieces alive somewhere in (lo, hi) take part; a query steps down one start per round
        past the starts not active at its moment, which are only those opened or closed inside the
        window: a short window keeps the rounds few."""
        ids = np.flatnonzero((self.opened < hi) & (self.closed > lo))  # still sorted by (start, opened)
        start, closed = self.start[ids], self.closed[ids]
        starts, group = np.unique(start, return_inverse=True)
        key = group.astype(np.int64) * self.span + (self.opened[ids] + 1)
        out = np.full(len(addr), -1, dtype=np.int32)
        j = np.searchsorted(starts, addr, side="right") - 1
        todo = np.flatnonzero(j >= 0)
        while len(todo):
            jt = j[todo]
            k = np.searchsorted(key, jt * self.span + q[todo] + 1, side="left") - 1  # the last opened before q
            kc = np.maximum(k, 0)
            active = (k >= 0) & (group[kc] == jt) & (closed[kc] > q[todo])
            hit, kh = todo[active], kc[active]
            out[hit] = np.where(addr[hit] < start[kh] + self.size[ids[kh]], ids[kh], -1)
            j[todo] -= 1
            todo = todo[~active & (j[todo] >= 0)]
        return out


def _placed_blocks(trace: Trace, pieces: _Pieces) -> tuple[np.ndarray, np.ndarray]:
    """(position, piece) of every alloc / free_completed that lands in a segment, in event order;
    positions int32 below 2**31 events, pieces int32. Done in windows of events."""
    ev = trace.events
    n = len(ev)
    idx = np.int32 if n < 2**31 - 1 else np.int64
    out_pos, out_k = [], []
    for c in range(0, n, _WINDOW):
        act = ev["action"][c : c + _WINDOW]
        pos = np.flatnonzero((act == _ALLOC) | (act == _FREE)) + c
        k = pieces.find(ev["addr"][pos], 2 * pos + 1, 2 * c, 2 * (c + len(act)) + 1)
        hit = k >= 0
        out_pos.append(pos[hit].astype(idx))
        out_k.append(k[hit])
    return np.concatenate(out_pos or [np.zeros(0, idx)]), np.concatenate(out_k or [np.zeros(0, np.int32)])


def _pinned_columns(trace: Trace, lt: Lifetimes) -> np.ndarray:
    """The pinned bytes after every event (index 0: before the first)."""
    pieces = _Pieces(_history(trace))
    n = len(trace.events)
    before = lt.addr[lt.alloc_pos < 0]
    k0 = pieces.find(before, np.zeros(len(before), np.int64), -1, 1)
    placed = _placed_blocks(trace, pieces)
    n_chains = len(pieces.chain_closed)
    c0 = np.bincount(pieces.chain[k0[k0 >= 0]], minlength=n_chains)  # blocks live before recording
    pos, k = placed
    del placed, k0
    live, g, starts = _live_counts(trace, pos, k, pieces.chain, c0)
    delta = np.zeros(n + 1, dtype=np.int64)  # delta[i + 1]: the change made by event i
    # a segment is pinned while its live count is above 0
    was = np.empty(len(live), dtype=bool)
    was[1:] = live[:-1] > 0
    was[starts] = c0[g[starts]] > 0
    now = live > 0
    for sel, sign in ((now & ~was, 1), (was & ~now, -1)):
        delta[pos[sel] + 1] = sign * pieces.size[k[sel]]  # one event per position
    del was, now, pos, k
    # at a segment's free: its bytes (its last piece's) go if it still held a live block
    last_live = c0.copy()
    ends = np.append(starts[1:], len(live)) - 1 if len(live) else starts
    last_live[g[ends]] = live[ends]
    last_size = np.zeros(n_chains, dtype=np.int64)
    last = np.flatnonzero(np.append(pieces.chain[1:] != pieces.chain[:-1], True))  # a chain's pieces are adjacent
    last_size[pieces.chain[last]] = pieces.size[last]
    shut = (pieces.chain_closed < 2 * n + 1) & (last_live > 0)
    delta[(pieces.chain_closed[shut] - 1) // 2 + 1] -= last_size[shut]  # one free closes one segment
    # segments pinned from the start: from before recording, with a live block then
    first = pieces.opened < 0
    delta[0] = int(pieces.size[first][c0[pieces.chain[first]] > 0].sum())
    return np.cumsum(delta, out=delta)


def _live_counts(
    trace: Trace, pos: np.ndarray, k: np.ndarray, chain: np.ndarray, c0: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each placed block event's segment live count after it, floored at 0 as the loop does (a free in
    an empty segment is ignored), with ``pos`` and ``k`` reordered in place by (segment, position):
    (live, segment, index where each segment's run starts)."""
    g = chain[k]
    order = np.argsort(g, kind="stable")  # pos is ascending: (segment, position)
    pos[:], k[:], g = pos[order], k[order], g[order]
    del order
    m = len(g)
    starts = np.flatnonzero(np.diff(g, prepend=-1)) if m else np.zeros(0, np.int64)
    sign = np.zeros(256, dtype=np.int8)
    sign[_ALLOC], sign[_FREE] = 1, -1
    step = sign[trace.events["action"][pos].view(np.uint8)]
    wide = np.int32 if m + int(c0.max(initial=0)) < 2**31 - 1 else np.int64
    s = np.cumsum(step, dtype=wide)  # S = c0 + running sum within the segment
    counts = np.diff(np.append(starts, m))
    s += np.repeat((c0[g[starts]] - (s[starts] - step[starts])).astype(wide), counts)
    low = np.minimum.reduceat(s, starts) < 0 if m else np.zeros(0, bool)
    if low.any():  # live = S - min(0, running min of S), only where S goes below 0
        sub = np.flatnonzero(np.repeat(low, counts))
        big = 2 * (m + int(c0.max(initial=0))) + 4
        off = g[sub].astype(np.int64) * big
        run_min = np.minimum.accumulate(s[sub] - off) + off
        s[sub] -= np.minimum(run_min, 0).astype(wide)
    return s, g, starts
