"""The view's queries, answered from an analysed rank: the icicle path of every allocation, a zoomed window of
the timeline (exact steps when it holds few events, a min/max envelope per pixel otherwise) and the live set
after one event. ``memtrace view --serve`` (``cli._serve``) answers the page with them; ``plots.view_html`` uses
the window for the coarse overview and ``plots.view_data`` the paths.

The answers have the shape the page's own code (``assets/view.js``) computes for a page that carries its events:
``{"data": [x, stacked categories top first..., reserved, device used], "exact", "events"}`` and ``{"event",
"t_us", "total", "count", "groups", "around"}``. Every value comes from the analysis (an ``AnalysedRank``'s
curves, categories, lifetimes, icicle paths); this module only selects and groups.

An allocation's icicle path is exactly what ``memtrace flame`` builds (``flame.stack_paths``): allocations that
share a path (same stack outside every hook call; same phase without a stack; memory from before recording) are
asked once per class; those made while a hook ran one by one (they are few: workspace allocations).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from memtrace.analysis.holders.flame import FramePaths, frame_label, stack_paths
from memtrace.analysis.holders.frames import site_frame
from memtrace.analysis.holders.live import Lifetimes, LiveAllocation
from memtrace.analysis.memory.categories import CATEGORIES, in_hook_calls, innermost_phase_indices
from memtrace.analysis.memory.phases import recording_span
from memtrace.model import ACTIONS, Trace, empty_events, empty_samples

_ALLOC = ACTIONS.index("alloc")


class RankQueries:
    """Precomputed arrays of one rank (curve index i = the state after event i - 1), in page time."""

    def __init__(self, a, t0_us: int) -> None:
        """``a``: an ``analysis.rank.AnalysedRank``; ``t0_us``: the run's origin (the page's time 0)."""
        self.a, self.t0 = a, t0_us
        self.t = a.event_times - t0_us
        # read at the window's few thousand indices: no per-category curve of every event is built
        self.cats = a.category_steps
        self.alloc = a.curves.allocated.bytes
        self.res = a.curves.reserved.bytes
        self.dev_t = a.curves.device_used.time_us - t0_us
        self.dev = a.curves.device_used.bytes
        self.curve_t0 = int(a.curves.allocated.time_us[0]) - t0_us

    def event_at(self, t_us: float) -> int:
        return int(np.searchsorted(self.t, t_us, side="right")) - 1

    def window(self, x0: float, x1: float, width: int) -> dict[str, Any]:
        """The chart's data between ``x0`` and ``x1`` seconds for a chart ``width`` pixels wide."""
        width = max(int(width), 10)
        t0, t1 = x0 * 1e6, x1 * 1e6
        i0, i1 = self.event_at(t0), int(np.searchsorted(self.t, t1, side="right"))
        count = i1 - i0 - 1
        if count <= 4 * width:
            idx = np.arange(i0 + 1, i1)
            ex, ci = np.concatenate(([t0], self.t[idx])), np.concatenate(([i0 + 1], idx + 1))
            res = self.res[ci]
        else:
            ex, ci, res = self._envelope(i0 + 1, i1, t0, t1, width)
        j0 = max(int(np.searchsorted(self.dev_t, t0, side="right")) - 1, 0)
        j1 = int(np.searchsorted(self.dev_t, t1, side="right"))
        step = max(1, -(-(j1 - j0) // (4 * width)))
        dx = np.maximum(self.dev_t[j0:j1:step], t0)
        x = np.union1d(ex, dx)
        e_at = np.searchsorted(ex, x, side="right") - 1
        d_at = np.searchsorted(dx, x, side="right") - 1
        dev = [None if k < 0 else int(self.dev[j0 + k * step]) for k in d_at.tolist()]
        cols = [(x / 1e6).tolist()]
        stacked = np.cumsum(self.cats.at(ci), axis=0)[::-1]  # top (all categories) first, as drawn
        cols += [stacked[k][e_at].tolist() for k in range(len(CATEGORIES))]
        cols += [res[e_at].tolist(), dev]
        cols = [c + [c[-1]] for c in cols]
        cols[0][-1] = x1
        return {"data": cols, "exact": bool(count <= 4 * width), "events": int(count)}

    def _envelope(self, lo: int, hi: int, t0: float, t1: float, width: int) -> tuple:
        """Per pixel column of events ``lo..hi-1``: the fullest and the emptiest moment (allocated), and
        reserved's max and min. Times are sorted, so each column is one slice: O(n), no sort, and the
        columns are read through views (no event-length copies: 10M events are 80 MB a column)."""
        vals, rv, t = self.alloc[lo + 1 : hi + 1], self.res[lo + 1 : hi + 1], self.t[lo:hi]
        bw = (t1 - t0) / width
        edges = np.searchsorted(t, t0 + bw * np.arange(width), side="left")
        starts = np.unique(np.clip(edges, 0, hi - lo - 1))
        counts = np.diff(np.r_[starts, hi - lo])

        def first_where(target: np.ndarray) -> np.ndarray:
            hit = np.flatnonzero(vals == np.repeat(target, counts))
            return lo + hit[np.searchsorted(hit, starts)]

        top = first_where(np.maximum.reduceat(vals, starts))
        low = first_where(np.minimum.reduceat(vals, starts))
        b = np.floor((t[starts] - t0) / bw)
        ex = np.concatenate(([t0], np.stack((t0 + b * bw, t0 + (b + 0.5) * bw), 1).ravel()))
        ci = np.concatenate(([lo], np.stack((top + 1, low + 1), 1).ravel()))
        rmax, rmin = np.maximum.reduceat(rv, starts), np.minimum.reduceat(rv, starts)
        res = np.concatenate(([self.res[lo]], np.stack((rmax, rmin), 1).ravel()))
        return ex, ci, res

    def live(self, e: int, *, top: int = 200) -> dict[str, Any]:
        """The allocations live right after event ``e``, grouped by icicle path (:func:`allocation_paths`)."""
        a, lt = self.a, self.a.lifetimes
        tr = a.trace
        m = np.flatnonzero((lt.alloc_pos <= e) & (lt.free_pos > e))
        paths = a.icicle_paths
        ids = paths.ids[m]
        nbytes = np.bincount(ids, weights=lt.size[m], minlength=len(paths.paths)).astype(np.int64)
        counts = np.bincount(ids, minlength=len(paths.paths))
        order = [int(p) for p in np.argsort(-nbytes, kind="stable")[:top] if counts[p]]
        out = [
            {
                "path": [paths.labels[x] for x in paths.paths[p]],
                "title": paths.titles[p],
                "bytes": int(nbytes[p]),
                "count": int(counts[p]),
            }
            for p in order
        ]
        ev, cats = tr.events, a.categorized.codes
        lo, hi = max(0, e - 12), min(len(ev), e + 13)
        around = [
            {
                "index": i,
                "t_us": float(self.t[i]),
                "action": ACTIONS[int(ev["action"][i])],
                "size": int(ev["size"][i]),
                "category": CATEGORIES[int(cats[i])] if cats[i] >= 0 else "",
                "where": _title(tr, int(ev["stack"][i])),
            }
            for i in range(lo, hi)
        ]
        t_us = float(self.t[e]) if e >= 0 else float(self.curve_t0)
        total = int(lt.size[m].sum())
        return {"event": e, "t_us": t_us, "total": total, "count": len(m), "groups": out, "around": around}


@dataclass(frozen=True)
class Paths:
    """``ids[k]``: the path of allocation k of the Lifetimes; ``paths[id]``: label ids root→leaf."""

    ids: np.ndarray  # int32, one per allocation of the Lifetimes
    labels: list[str]
    paths: list[list[int]]
    titles: list[str]  # what the top-holders table calls each path


def _without_events(trace: Trace) -> Trace:
    """``trace`` without its event and sample arrays but with the same recording span: ``stack_paths``
    reads phases, hook calls and stacks, and would otherwise scan every event once per call."""
    start, end = recording_span(trace)
    rec = dataclasses.replace(trace.recording, start_us=start, end_us=end)
    return dataclasses.replace(trace, events=empty_events(), samples=empty_samples(), recording=rec)


class _Interner:
    def __init__(self, trace: Trace) -> None:
        self.trace = _without_events(trace)
        self.paths_of = FramePaths(self.trace)
        self.ids: dict[tuple[str, ...], int] = {}
        self.titles: list[str] = []

    def path_of(self, stack: int, alloc_us: int | None) -> int:
        """The interned path of one allocation made at ``alloc_us`` (None: before recording)."""
        (key,) = stack_paths(self.trace, [LiveAllocation(0, 1, stack, alloc_us)], self.paths_of)[0]
        if key not in self.ids:
            self.ids[key] = len(self.ids)
            self.titles.append(_title(self.trace, stack, " ".join(key)))
        return self.ids[key]

    def paths(self, ids: np.ndarray) -> Paths:
        """The interned paths as label ids, the labels in first-seen order."""
        labels: dict[str, int] = {}
        paths = [[labels.setdefault(x, len(labels)) for x in key] for key in self.ids]
        return Paths(ids, list(labels), paths, self.titles)


def _title(trace: Trace, stack: int, default: str = "") -> str:
    """What the top-holders table calls ``stack``'s allocations (``default`` for no stack)."""
    f = site_frame(trace, stack)
    return frame_label(f) if f is not None else default


def allocation_paths(trace: Trace, lt: Lifetimes) -> Paths:
    """The flame graph's path of every allocation in ``lt`` (see the module docstring)."""
    ids = np.zeros(len(lt.size), dtype=np.int32)
    interner = _Interner(trace)
    recorded = lt.alloc_pos >= 0
    hooked = recorded & in_hook_calls(trace, lt.alloc_us)
    for k in np.flatnonzero(hooked):  # one by one: the hooks running differ
        ids[k] = interner.path_of(int(lt.stack[k]), int(lt.alloc_us[k]))
    plain = ~hooked
    with_stack = plain & (lt.stack >= 0)
    stacks = np.unique(lt.stack[with_stack])  # a stack's path does not depend on when, outside hooks
    by_stack = np.array([interner.path_of(int(s), None) for s in stacks], dtype=np.int32)
    ids[with_stack] = by_stack[np.searchsorted(stacks, lt.stack[with_stack])]
    no_stack = plain & (lt.stack < 0) & recorded
    phase = innermost_phase_indices(trace, lt.alloc_us[no_stack])
    where = np.flatnonzero(no_stack)
    phases, first = np.unique(phase, return_index=True)  # no stack: the phase it was made in
    by_phase = np.array([interner.path_of(-1, int(lt.alloc_us[where[k]])) for k in first], dtype=np.int32)
    ids[where] = by_phase[np.searchsorted(phases, phase)] if len(where) else ids[where]
    before = plain & (lt.stack < 0) & ~recorded
    if before.any():
        ids[before] = interner.path_of(-1, None)
    return interner.paths(ids)
