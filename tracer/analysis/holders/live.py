"""What is live at a moment: the tensors' blocks allocated and not yet returned, and who asked.

"Live" means allocated and not yet ``free_completed`` (a block between ``free_requested`` and
``free_completed`` still waits on another stream and still occupies memory), the same rule as
``Curves.allocated``, so at any moment ``sum(size_bytes of live_allocations_at(t))`` equals
``all_curves(trace).allocated.at(t)`` when the recording is consistent.

Allocations come from three places:

1. A recorded ``alloc`` at address A lives until the next ``free_completed`` at A (if the next
   recorded event at A is another ``alloc``, a free was lost and the first block ends there).
2. A ``free_completed`` at A with no recorded ``alloc`` before it frees a block allocated *before
   recording began* (or before a ring buffer dropped its alloc): it lives from the start until that
   free. Its size is the free's (requested) size; its stack is unknown (-1): the free's stack is
   who released it, not who allocated it.
3. Blocks active in the final snapshot (``trace.segments``) whose address is not held by a
   recorded allocation still live at the end were allocated before recording and never freed: they
   live throughout, with the snapshot block's stack and requested size.
4. A profiler trace names no block held before it started, only its total (``importers.kineto``'s
   baseline): what of that total no recorded free released (2.) is one block without address or
   stack, live throughout (:data:`UNNAMED_ADDR`), so what was held before profiling is at every peak.

Moments are either a time (everything with time <= t has happened, as in ``Curve.at``) or an event
index (the state right after that event), which matters when several events share a microsecond,
as at a peak.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from memtrace.model import ACTION_CODE, Trace

_ALLOC = ACTION_CODE["alloc"]
_FREE_COMPLETED = ACTION_CODE["free_completed"]
_BEFORE = np.iinfo(np.int64).min
#: the holder of the blocks present before recording began, without a stack (``holders_by_stack``)
BEFORE_RECORDING = -2
_NEVER = np.iinfo(np.int64).max
#: the address of the one block that stands for a profiler trace's unnamed memory from before it started (4.)
UNNAMED_ADDR = -1


@dataclass(frozen=True)
class LiveAllocation:
    """One block live at the moment asked about."""

    addr: int
    size_bytes: int  # requested bytes
    stack: int  # index into trace.stacks, -1 when unknown
    alloc_us: int | None  # None: allocated before recording began


@dataclass(frozen=True)
class Holder:
    """Live bytes grouped by the stack that allocated them."""

    stack: int
    bytes: int
    count: int  # blocks; the unnamed rest of a profiler trace's memory from before it started is none
    share: float  # of all live bytes at that moment


@dataclass(frozen=True)
class Lifetimes:
    """Every allocation the trace knows of, columnar. Positions are event indexes; -1 before recording,
    ``len(events)`` for never freed."""

    addr: np.ndarray
    size: np.ndarray
    stack: np.ndarray
    alloc_us: np.ndarray  # _BEFORE for baseline blocks
    alloc_pos: np.ndarray
    free_us: np.ndarray  # _NEVER when still live at the end
    free_pos: np.ndarray


def lifetimes(trace: Trace, times: np.ndarray | None = None) -> Lifetimes:
    """Pair every alloc with its free_completed (vectorised), and add blocks from before recording.

    ``times``: the events' times made non-decreasing, when already computed (the curves' time axis after its
    first point, ``AnalysedRank.event_times``). An analysed rank computes the lifetimes once
    (``analysis.rank.AnalysedRank.lifetimes``); pass them on to share them."""
    ev = trace.events
    n = len(ev)
    action = ev["action"]
    if times is None:
        times = np.maximum.accumulate(ev["time_us"].astype(np.int64)) if n else ev["time_us"].astype(np.int64)
    # (temporaries are reassigned one at a time: at 10M events each is ~50 MB, and diff analyses two runs at once)
    idx = np.flatnonzero((action == _ALLOC) | (action == _FREE_COMPLETED))
    addr = ev["addr"][idx].astype(np.int64, copy=False)
    order = np.lexsort((idx, addr))
    idx = idx[order]
    addr = addr[order]
    del order
    is_alloc = action[idx] == _ALLOC
    same_next = np.zeros(len(idx), dtype=bool)
    same_next[:-1] = addr[:-1] == addr[1:]
    # 1. recorded allocs: ended by the next event at the same address, if any
    a = np.flatnonzero(is_alloc)
    ended = same_next[a]
    a_free_pos = np.where(ended, idx[np.minimum(a + 1, len(idx) - 1)] if len(a) else a, n)
    a_free_us = np.where(ended, times[np.minimum(a_free_pos, max(n - 1, 0))] if len(a) else a, _NEVER)
    # 2. orphan frees: a free_completed not preceded (at its address) by an alloc
    prev_alloc = np.zeros(len(idx), dtype=bool)
    prev_alloc[1:] = same_next[:-1] & is_alloc[:-1]
    o = np.flatnonzero(~is_alloc & ~prev_alloc)
    # 3. final-snapshot blocks not held by a recorded allocation live at the end
    live_at_end = set(addr[a[~ended]].tolist())
    base = [
        (b.address, b.requested_bytes, b.stack)
        for s in trace.segments
        for b in s.blocks
        if b.state.startswith("active") and b.address not in live_at_end
    ]
    ev_a, ev_o = idx[a], idx[o]
    unnamed = _unnamed_before(trace, int(ev["size"][ev_o].sum()))
    if unnamed:
        base.append((UNNAMED_ADDR, unnamed, -1))
    b_addr = np.array([x[0] for x in base], dtype=np.int64)
    b_size = np.array([x[1] for x in base], dtype=np.int64)
    b_stack = np.array([x[2] for x in base], dtype=np.int32)
    nb = len(base)
    out_addr = np.concatenate((addr[a], addr[o], b_addr))
    del idx, addr, is_alloc, same_next, prev_alloc, a, ended
    return Lifetimes(
        addr=out_addr,
        size=np.concatenate((ev["size"][ev_a], ev["size"][ev_o], b_size)).astype(np.int64, copy=False),
        stack=np.concatenate((ev["stack"][ev_a], np.full(len(o), -1, np.int32), b_stack)).astype(np.int32, copy=False),
        alloc_us=np.concatenate((times[ev_a], np.full(len(o) + nb, _BEFORE, np.int64))),
        alloc_pos=np.concatenate((ev_a, np.full(len(o) + nb, -1, np.int64))).astype(np.int64, copy=False),
        free_us=np.concatenate((a_free_us, times[ev_o], np.full(nb, _NEVER, np.int64))).astype(np.int64, copy=False),
        free_pos=np.concatenate((a_free_pos, ev_o, np.full(nb, n, np.int64))).astype(np.int64, copy=False),
    )


def _unnamed_before(trace: Trace, freed_bytes: int) -> int:
    """The bytes of a profiler trace's total from before it started that no recorded free released (4.); 0 for
    any other trace (its blocks from before recording are named by the final snapshot or by their frees)."""
    from memtrace import facts as F

    known = (trace.facts.get(F.IMPORT) or {}).get("baseline") if not trace.segments else None
    return max(int(known.get("allocated_bytes") or 0) - freed_bytes, 0) if known else 0


def _mask(lt: Lifetimes, t_us: int | None, event_index: int | None) -> np.ndarray:
    if event_index is not None:
        return (lt.alloc_pos <= event_index) & (lt.free_pos > event_index)
    if t_us is None:
        raise ValueError("give t_us or event_index")
    return (lt.alloc_us <= t_us) & (lt.free_us > t_us)


def live_bytes_at(lt: Lifetimes, t_us: int, since_us: int | None = None) -> int:
    """Bytes live at ``t_us`` (the sizes :func:`live_allocations_at` lists), only those allocated at or after
    ``since_us`` when given (blocks from before recording never count then)."""
    m = _mask(lt, t_us, None)
    if since_us is not None:
        m &= lt.alloc_us >= since_us
    return int(lt.size[m].sum())


def live_allocations_at(
    trace: Trace, t_us: int | None = None, *, event_index: int | None = None, lt: Lifetimes | None = None
) -> list[LiveAllocation]:
    """Blocks live at ``t_us`` (or right after event ``event_index``), largest first.

    Args:
        trace: the trace.
        t_us: a Unix-epoch microsecond; every event at or before it has happened.
        event_index: instead of a time, the state right after ``trace.events[event_index]``
            (use ``Curve.peak_index - 1`` for the state at a curve's peak).
        lt: precomputed :func:`lifetimes`, to share work between queries.
    """
    lt = lt or lifetimes(trace)
    m = np.flatnonzero(_mask(lt, t_us, event_index))
    m = m[np.argsort(-lt.size[m], kind="stable")]
    return [
        LiveAllocation(
            addr=int(lt.addr[i]),
            size_bytes=int(lt.size[i]),
            stack=int(lt.stack[i]),
            alloc_us=None if lt.alloc_us[i] == _BEFORE else int(lt.alloc_us[i]),
        )
        for i in m
    ]


def knows_holders(trace: Trace) -> bool:
    """False for a trace whose allocations carry no address (a torch.profiler trace of PyTorch before 1.10,
    the device's and the CPU's alike): no free can be paired with its allocation, so what was live, and whose,
    is not in it; its allocated curve (the running sum of the sizes) still is. Told by the events themselves:
    its first allocations all have address 0, which no allocator hands out (no record beside the data)."""
    head = trace.events[:_HEAD_EVENTS]
    addrs = head["addr"][head["action"] == ACTION_CODE["alloc"]]
    return addrs.size == 0 or bool((addrs != 0).any())


#: How many of a trace's first events :func:`knows_holders` reads.
_HEAD_EVENTS = 4096


def holders_by_stack(
    trace: Trace,
    t_us: int | None = None,
    top: int = 10,
    *,
    event_index: int | None = None,
    lt: Lifetimes | None = None,
) -> list[Holder]:
    """Live bytes at a moment grouped by allocating stack, largest first (at most ``top``).

    Blocks without a recorded stack are the holder -1, except those present before recording began: they
    are their own holder, :data:`BEFORE_RECORDING` (-2), as the flame graph's ``[present before recording began]``.
    None ([]) for a trace that cannot tell who held what (:func:`knows_holders`).
    """
    if not knows_holders(trace):
        return []
    lt = lt or lifetimes(trace)
    m = _mask(lt, t_us, event_index)
    stacks = lt.stack[m].astype(np.int64)
    stacks = np.where((stacks < 0) & (lt.alloc_us[m] == _BEFORE), BEFORE_RECORDING, stacks) + 2  # -2, -1 -> 0, 1
    if len(stacks) == 0:
        return []
    sizes = np.bincount(stacks, weights=lt.size[m]).astype(np.int64)
    counts = np.bincount(stacks, weights=lt.addr[m] != UNNAMED_ADDR).astype(np.int64)  # the unnamed rest: no block
    total = int(lt.size[m].sum())
    order = np.argsort(-sizes, kind="stable")
    out = []
    for s in order[:top]:
        if sizes[s] == 0 and counts[s] == 0:
            break
        out.append(Holder(int(s) - 2, int(sizes[s]), int(counts[s]), float(sizes[s] / total) if total else 0.0))
    return out
