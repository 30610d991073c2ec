"""Pack one run's analysis results into the compact form ``memtrace view``'s page reads (no HTML here).

Per rank (an ``analysis.rank.AnalysedRank``) the page gets a small JSON document (its figures, target,
OOM, phases, landmarks, time origin, the interned icicle paths of ``holders.view_window``) and one binary blob of little-endian columns, gzip'd
(the page inflates it with the browser's ``DecompressionStream``). Event columns, one entry per
allocator event in trace order:

- ``dt`` uint32: microseconds since the previous event (times made non-decreasing, as ``curves``);
- ``act`` uint8: the action code (``model.ACTIONS``); ``cat`` int8: the category (``categories``);
- ``size`` float64: bytes (exact: sizes stay below 2**53);
- ``stack`` int32: the interned stack, -1 when none (the events table names its innermost frame);
- ``life`` int32: for an ``alloc``, how many events later its allocation ends (``live.lifetimes``' free
  position minus its own; past the end when never freed), 0 for other actions;
- ``path`` int32: for an ``alloc``, its icicle path (``view_window.allocation_paths``: frames, hook calls, phase), else -1.

plus ``pre_*`` columns for allocations live before the first event (``live.lifetimes`` with no alloc
position: their end position, size, path) and the NVML ``dev_*`` columns (device used, and
non-PyTorch as the report states it: ``landmarks.steady_non_torch`` in force at each sample, not the raw
used - reserved, which spikes by whole allocations when a sample and the allocator disagree).
When the trace holds CUPTI records (``non_torch.has_records``) the ``cupti_*`` columns follow:
``cupti_t``/``cupti_bytes``, ``non_torch.live_curve`` (the non-PyTorch bytes CUPTI saw live from that
step on; 0 before the first). The page shows it and the unexplained rest, NVML's non-PyTorch minus
it. Without records they are left out; the page finds columns by name in the column table (the blob
has no format number to bump). Likewise, when vLLM (0.34+) committed its KV cache through CUDA's VMM API,
the ``vmm_*`` columns: ``vmm_t``/``vmm_kv``, ``AnalysedRank.vmm_kv`` (the KV cache committed outside
PyTorch from that step on; 0 before the first): the page draws it as a band on top of reserved and reads it
out at the cursor; ``meta["vmm"]`` holds its figures (``AnalysedRank.vmm``), None before 0.34.
From these the page computes the curves and, at any event, the exact live set: an allocation at event
``i`` is live after event ``e`` when ``i <= e < i + life[i]``. Only packing happens here: every figure
comes from the analysis modules.

A rank whose trace holds a serving window (``MEMTRACE_UNTIL=serving``) is two parts: start-up, packed as
above and ending where start-up ended, and the window analysed as a trace of its own (``AnalysedRank.serving``),
packed the same way (:func:`pack_window`) with the gap between them; :func:`time_axis` squeezes the gap on the
page's time axis as ``memtrace plot`` does.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from memtrace.analysis.analysed.landmarks import steady_non_torch_values
from memtrace.analysis.analysed.rank import AnalysedRank
from memtrace.analysis.analysed.summary import summary_doc
from memtrace.analysis.holders.flame import frame_label
from memtrace.analysis.holders.frames import site_frame
from memtrace.analysis.memory.categories import CATEGORIES
from memtrace.analysis.memory.quantities import OTHERS, holds_reserved
from memtrace.analysis.memory.target import describe
from memtrace.model import ACTIONS
from memtrace.plots import oom_text
from memtrace.plots.palette import CATEGORY_COLORS, VMM_KV_LABEL
from memtrace.plots.serving_text import window_lines
from memtrace.plots.text import before_recording_text
from memtrace.plots.timeline_breaks import GAP_EDGE, gap_label
from memtrace.plots.timeline_scale import time_scale

#: Columns of the binary blob, in order: (name, numpy dtype).
EVENT_COLUMNS = (
    ("dt", "<u4"),
    ("act", "u1"),
    ("cat", "i1"),
    ("size", "<f8"),
    ("stack", "<i4"),
    ("life", "<i4"),
    ("path", "<i4"),
)
PRE_COLUMNS = (("pre_end", "<i4"), ("pre_size", "<f8"), ("pre_path", "<i4"))
DEVICE_COLUMNS = (("dev_t", "<f8"), ("dev_used", "<f8"), ("dev_nontorch", "<f8"))
#: Only in the blob of a trace with CUPTI records: ``non_torch.live_curve``.
CUPTI_COLUMNS = (("cupti_t", "<f8"), ("cupti_bytes", "<f8"))
#: Only in the blob of a trace whose KV cache was committed through CUDA's VMM API: ``AnalysedRank.vmm_kv``.
VMM_COLUMNS = (("vmm_t", "<f8"), ("vmm_kv", "<f8"))
#: Only in the blob of a trace that sampled other processes on its device: ``Curves.others`` (the view's band over
#: device used: a neighbour's growth, the serving OOM's cause on a shared card).
OTHERS_COLUMNS = (("oth_t", "<f8"), ("oth_bytes", "<f8"))
_EXACT = 1 << 53


@dataclass
class PackedRank:
    """One rank, ready to embed: ``meta`` is JSON-ready, ``blob`` the gzip'd columns (``columns`` says
    where each starts and how long it is, before compression)."""

    meta: dict[str, Any]
    blob: bytes
    columns: list[dict[str, Any]] = field(default_factory=list)
    #: the serving window after start-up, packed as a rank of its own (``AnalysedRank.serving``), its
    #: ``meta["gap"]`` saying what lies between; None without one
    window: PackedRank | None = None


def event_at(times: np.ndarray, t_us: int) -> int:
    """The last event at or before ``t_us`` (-1: before the first)."""
    return int(np.searchsorted(times, t_us, side="right")) - 1


def _landmarks(a: AnalysedRank) -> list[dict[str, Any]]:
    """The page's landmark buttons: the peak, the crossings (the one every output names first called "first
    crossing", as the report orders them), the OOM, the end of each phase; each with the figure it marks."""
    times = a.event_times
    h = a.headline  # the run's peak, decided once: the peak held on an extensible-KV run
    at = h.event_index if h.event_index is not None else event_at(times, h.point.time_us)
    out = [{"name": "peak", "event": at, **_peak_mark(a)}]
    for k, c in enumerate(a.crossing_list):
        label = f"{'first crossing' if k == 0 else 'crossing'} ({c.curve.replace('_', ' ')})"
        out.append({"name": label, "event": event_at(times, c.time_us), "time_us": c.time_us, "curve": c.curve,
                    "bytes": c.at_cross_bytes, "phase": c.phase_path, "max_bytes": c.max_bytes,
                    "max_phase": c.max_phase_path})  # fmt: skip
    if a.oom is not None and a.oom.time_us <= _drawn_end(a, a.oom.time_us):  # not one in the serving window
        out.append({"name": "OOM", "event": event_at(times, a.oom.time_us), "time_us": a.oom.time_us,
                    "phase": a.oom.phase_path})  # fmt: skip
    for p in a.phases:
        out.append({"name": f"end {p.name}", "event": event_at(times, p.end_us), "time_us": p.end_us})
    for m in a.user_metadata:  # torch's _set_memory_metadata labels: where each began
        out.append({"name": f"label {m.value}", "event": event_at(times, m.first_us), "time_us": m.first_us})
    return out


def _peak_mark(a: AnalysedRank) -> dict[str, Any]:
    """The peak's curve, figure and moment as the page marks it: the rank's headline (``AnalysedRank.headline``:
    held on an extensible-KV run, else reserved at its fullest, or allocated for the CPU's trace)."""
    h = a.headline
    return {"curve": h.point.curve, "bytes": h.point.bytes, "time_us": h.state_us}


def rank_meta(a: AnalysedRank, t0_us: int) -> dict[str, Any]:
    """The JSON part of one rank (figures exact, in bytes and microseconds)."""
    t, oom = a.trace, a.oom
    start, end = a.span
    titles = []
    for st in range(len(t.stacks)):
        f = site_frame(t, st)
        titles.append(frame_label(f) if f is not None else "")
    doc = summary_doc(a)
    paths = a.icicle_paths
    return {
        "label": t.label,
        "t0_us": t0_us,
        "time_origin": a.origin.sentence,
        "verdict": a.verdict,
        "n_events": len(t.events),
        "t_first_us": int(a.curves.allocated.time_us[0]) - t0_us,
        "start_us": start - t0_us,
        "end_us": _drawn_end(a, end) - t0_us,
        "baseline": {"allocated": a.curves.baseline.allocated_bytes, "reserved": a.curves.baseline.reserved_bytes},
        "before_recording": _before_recording(a),
        "target": {
            "bytes": a.target.target_bytes,
            "capacity": a.target.capacity_bytes,
            "util": a.target.util,
            "source": a.target.source,
            "described": describe(a.target),
        },
        "peak": doc["peak"],
        "peak_mark": _peak_mark(a),
        # what the chart, its legend, hover and phase table show: no reserved line or columns for a CPU profiler
        # trace (its 'Total Reserved' stays 0), no NVML rows for a trace without NVML samples
        "holds_reserved": holds_reserved(t.process),
        "has_device": a.curves.has_device,
        "peak_bound": doc["peak_bound"],
        "crossings": doc["crossings"],
        # the marker's words (``oom_text``: "requested 22.00 MiB", as torch's message says it)
        "oom": None if oom is None else {**oom.__dict__, "label": f"OOM ({oom_text.requested(oom)})"},
        "phases": [
            {
                "name": p.name,
                "path": p.path,
                "depth": p.depth,
                "start_us": p.start_us - t0_us,
                "end_us": p.end_us - t0_us,
            }
            for p in a.phases
        ],
        "phase_table": doc["phases"],
        "landmarks": _landmarks(a),
        "stack_titles": titles,
        "labels": paths.labels,
        "paths": paths.paths,
        "path_titles": paths.titles,
        "categories": list(CATEGORIES),
        "category_colors": [CATEGORY_COLORS[c] for c in CATEGORIES],
        "actions": list(ACTIONS),
        "vmm": _vmm(a),
        "others": {"label": f"{OTHERS.label} (NVML)", "peak_bytes": a.peak_others.bytes} if has_others(a) else None,
        # the serving window, stated (``serving_text.window_lines``); drawn from ``PackedRank.window``
        "serving": window_lines(a.window, t0_us),
    }


def _drawn_end(a: AnalysedRank, end: int) -> int:
    """Where this part of the chart ends: at an OOM (nothing drawn after it), and at start-up's end when a
    serving window follows (drawn after the gap from the window's own part, ``pack_window``)."""
    w = a.trace.window
    if w is not None and w.startup_end_us is not None and not a.joined:  # the window drawn apart
        return min(end, w.startup_end_us)
    return end if a.oom is None else min(end, a.oom.time_us)


def _before_recording(s) -> dict[str, Any] | None:
    """The memory present before recording began (``AnalysedRank.before_recording``) and the report's line on it;
    None when there was none to state (or the trace is a snapshot of one moment)."""
    b = s.before_recording
    if b is None or not b.nonzero:
        return None
    return {**asdict(b), "line": before_recording_text(b)}


def _vmm(a: AnalysedRank) -> dict[str, Any] | None:
    """The KV cache committed through CUDA's VMM API (``AnalysedRank.vmm``), None when there is none; the
    address space reserved is not memory (named so)."""
    v = a.vmm
    if v is None or not has_vmm_kv(a):
        return None
    return {
        "kv_cache_bytes": v.kv_cache_bytes,
        "kv_cache_peak_bytes": v.kv_cache_peak_bytes,
        "address_space_reserved_bytes": v.reserved_bytes,
        "held_peak_bytes": a.curves.held.peak_bytes,
        "label": VMM_KV_LABEL,
    }


def has_others(a: AnalysedRank) -> bool:
    """Whether other processes held memory on the rank's device while it was sampled (the view draws their band)."""
    return a.curves.has_device and bool(a.curves.others.bytes.any())


def has_vmm_kv(a: AnalysedRank) -> bool:
    """Whether the rank's KV cache was committed through CUDA's VMM API (vLLM 0.34+ with the extensible cache)."""
    return bool(a.vmm_kv.bytes.any())


def _columns(a: AnalysedRank, t0_us: int, *, with_events: bool = True) -> Iterator[tuple[str, np.ndarray]]:
    """The blob's columns in order, each built in its own dtype when its turn comes (at 10M events the
    event columns are 0.1-0.4 GiB each: no two wide copies are alive at once); without events, only
    the NVML ``dev_*`` columns (and the ``cupti_*`` / ``vmm_*`` ones, when the trace has them)."""
    ev, lt, n = a.trace.events, a.lifetimes, len(a.trace.events)
    paths, times, cats = a.icicle_paths, a.event_times, a.categorized.codes
    if with_events and n and int(ev["size"].max()) >= _EXACT:
        raise ValueError("an event size of 2**53 bytes or more cannot be carried exactly")
    rec = lt.alloc_pos >= 0
    dev = a.curves.device_used
    build = {
        "dt": lambda: _dt(times),
        "act": lambda: ev["action"],
        "cat": lambda: cats,
        "size": lambda: ev["size"],
        "stack": lambda: ev["stack"],
        "life": lambda: _at_allocs(n, lt.alloc_pos[rec], lt.free_pos[rec] - lt.alloc_pos[rec], 0),
        "path": lambda: _at_allocs(n, lt.alloc_pos[rec], paths.ids[rec], -1),
        "pre_end": lambda: lt.free_pos[~rec],
        "pre_size": lambda: lt.size[~rec],
        "pre_path": lambda: paths.ids[~rec],
        "dev_t": lambda: dev.time_us - t0_us,
        "dev_used": lambda: dev.bytes,
        "dev_nontorch": lambda: steady_non_torch_values(a.curves, dev.time_us),
        "cupti_t": lambda: a.cupti.time_us - t0_us,
        "cupti_bytes": lambda: a.cupti.bytes,
        "vmm_t": lambda: a.vmm_kv.time_us - t0_us,
        "vmm_kv": lambda: a.vmm_kv.bytes,
        "oth_t": lambda: a.curves.others.time_us - t0_us,
        "oth_bytes": lambda: a.curves.others.bytes,
    }
    cupti = CUPTI_COLUMNS if a.cupti is not None else ()
    vmm = VMM_COLUMNS if has_vmm_kv(a) else ()
    others = OTHERS_COLUMNS if has_others(a) else ()
    for name, dt_ in (*EVENT_COLUMNS, *PRE_COLUMNS, *DEVICE_COLUMNS, *cupti, *vmm, *others):
        if with_events or name.startswith(("dev_", "cupti_", "vmm_", "oth_")):
            yield name, np.ascontiguousarray(build[name](), dtype=dt_)


def _dt(times: np.ndarray) -> np.ndarray:
    """Microseconds since the previous event, as uint32 (the first event's is 0)."""
    if not len(times):
        return np.zeros(0, np.uint32)
    dt = np.diff(times, prepend=times[:1])
    if int(dt.max()) > 0xFFFFFFFF:
        raise ValueError("a gap of more than 71 minutes between two events")
    return dt.astype("<u4")


def _at_allocs(n: int, pos: np.ndarray, values: np.ndarray, fill: int) -> np.ndarray:
    """An int32 event column: ``values`` at the alloc positions ``pos``, ``fill`` elsewhere."""
    out = np.full(n, fill, dtype="<i4")
    out[pos] = values
    return out


def pack_rank(a: AnalysedRank, t0_us: int, *, with_events: bool = True) -> PackedRank:
    """The page's data for one rank; without events (a run too big for one page) only the JSON part
    and the NVML columns go in, and the page asks ``memtrace view --serve`` (``cli._serve``) for the rest."""
    meta = rank_meta(a, t0_us)
    meta["first_event_us"] = int(a.event_times[0]) - t0_us if len(a.event_times) else 0
    # compressed column by column (gzip, level 1): no uncompressed copy of the whole blob is ever made
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    parts, columns, offset = [], [], 0
    for name, arr in _columns(a, t0_us, with_events=with_events):
        columns.append({"name": name, "dtype": arr.dtype.str, "offset": offset, "length": len(arr)})
        parts.append(z.compress(arr.data.cast("B") if arr.nbytes else b""))
        offset += arr.nbytes
        pad = (-offset) % 8  # each column starts 8-aligned so the page can view it in place
        parts.append(z.compress(b"\0" * pad))
        offset += pad
        del arr
    parts.append(z.flush())
    meta["has_events"] = with_events
    window = pack_window(a, t0_us, with_events=with_events)
    if meta.get("serving"):  # the page heads the window's lines with it; a start-up-only rank has none
        meta["serving_heading"] = serving_heading(window, joined=a.joined)
    return PackedRank(meta, b"".join(parts), columns, window)


def serving_heading(window: PackedRank | None, *, joined: bool = False) -> str:
    """The heading over the serving window's lines on the page: where the chart draws the window (``joined``: in
    the rank's own timeline, ``serving.joined``)."""
    if joined:
        return "Serving window (after start-up; on the chart below under the serving bar, one timeline with start-up)"
    if window is None:
        return "Serving window (after start-up; it kept no allocator event, so the chart below shows start-up alone)"
    gap = window.meta["gap"]
    if gap["end_us"] > gap["start_us"]:
        return "Serving window (after start-up; on the chart below after the hatched gap, which was not recorded)"
    return "Serving window (after start-up; on the chart below from where start-up ended, under the serving bar)"


def pack_window(a: AnalysedRank, t0_us: int, *, with_events: bool = True) -> PackedRank | None:
    """The serving window of ``a``: the rank ``AnalysedRank.serving`` (the window analysed as a trace of its
    own) packed as any rank, its landmarks named as the window's (the OOM keeps its name), and ``meta["gap"]``:
    the time between start-up's end and the window's first kept record (page microseconds), what the ring
    dropped of it and the words its band says. None without a window holding allocator events."""
    win, w = a.serving, a.trace.window
    if win is None:  # joined in time (``AnalysedRank.joined``): the rank's own part holds it
        return None
    p = pack_rank(win, t0_us, with_events=with_events)
    for lm in p.meta["landmarks"]:
        if lm["name"] != "OOM" and not lm["name"].startswith("end "):
            lm["name"] = f"serving {lm['name']}"
    start = w.startup_end_us if w.startup_end_us is not None else w.start_us
    dropped = (w.events_dropped, w.samples_dropped, w.steps_dropped)
    p.meta["gap"] = {
        "start_us": start - t0_us,
        "end_us": w.start_us - t0_us,
        "events_dropped": dropped[0],
        "samples_dropped": dropped[1],
        "steps_dropped": dropped[2],
        "label": gap_label((w.start_us - start) / 1e6, dropped),
        "edge": GAP_EDGE,
    }
    return p


def time_axis(ranks: list[PackedRank]) -> dict[str, list] | None:
    """The page's time axis when a serving window follows start-up: each gap squeezed as ``memtrace plot``
    squeezes it (``timeline_scale.time_scale``; no flat stretch is broken, the page zooms instead), as knots
    in page microseconds and drawn microseconds (piecewise linear between them), with the gaps; None (a linear
    axis) without a gap."""
    gaps = [(g["start_us"], g["end_us"]) for r in ranks if r.window for g in [r.window.meta["gap"]]]
    gaps = [(a, b) for a, b in gaps if b > a]
    if not gaps:
        return None
    end = max((r.window or r).meta["end_us"] for r in ranks)
    scale = time_scale([], 0, end, gaps)
    return {
        "knots_us": [round(k * 1e6) for k in scale.knots_s],
        "drawn_us": [round(k * 1e6) for k in scale.knots_drawn],
        "gaps_us": [[round(a * 1e6), round(b * 1e6)] for a, b in scale.gaps],
    }
