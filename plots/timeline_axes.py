"""The three axes of one timeline row: the phase lane, the main plot and the zoom panel.

Called by ``timeline.render_timeline`` with matplotlib already imported; these functions only
draw onto the axes they are given. Bytes become the rank's y unit (``RankTimeline.unit``: GiB for a start-up,
KiB for a CPU profiler trace) and microseconds seconds here, nowhere else.
"""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
from memtrace.analysis.memory import quantities
from memtrace.analysis.memory.categories import CATEGORIES
from memtrace.plots.downsample import bucket_indices
from memtrace.plots.palette import CATEGORY_COLORS, VMM_KV_COLOR, VMM_KV_EDGE, VMM_KV_LABEL
from memtrace.plots.timeline_breaks import mark_breaks
from memtrace.plots.timeline_data import CuptiSplit, RankTimeline, cupti_split, vmm_band
from memtrace.plots.timeline_scale import TimeScale, identity
from memtrace.units import format_gib, format_size

COLORS = CATEGORY_COLORS
LABELS = {
    "weights": "weights",
    "kv_cache": "KV cache",
    "flashinfer_workspace": "FlashInfer workspace (hooks)",
    "cudagraph_pool": "CUDA-graph pools",
    "activations": "activations",
    "other": "other PyTorch",
}
NON_TORCH = "#E8A0A0"
VMM_KV_STYLE = {"color": VMM_KV_COLOR, "alpha": 0.45, "lw": 0, "hatch": "xx", "edgecolor": VMM_KV_EDGE}
NON_TORCH_STYLE = {"color": NON_TORCH, "alpha": 0.55, "lw": 0, "hatch": "///", "edgecolor": "#C06060"}
CUPTI = "#2A9D8F"  # the non-PyTorch memory CUPTI saw, exactly
CUPTI_EDGE = "#17645B"
OTHERS = "#B8C4CE"
OTHERS_EDGE = "#5A6B7B"  # the whole device's used memory, where other processes were not told apart
TARGET = "#C62828"
OOM_COLOR = "#4A0000"
ZOOM_BAND = "#FFD54F"
N_BUCKETS = 2400
DPI_HINT = 110  # the renderer's dpi, for sizing text before drawing
LABEL_PT = 11.0  # phase labels, line labels and the crossing's text: readable when GitHub scales the image down


def _s(t_us: np.ndarray | int, t0: int) -> Any:
    return (np.asarray(t_us, dtype=np.float64) - t0) / 1e6


def _g(b: np.ndarray | int, unit: tuple[str, int]) -> Any:
    """Bytes as floats of the y axis's ``unit`` (``RankTimeline.unit``)."""
    return np.asarray(b, dtype=np.float64) / unit[1]


def zoom_window(rank: RankTimeline) -> tuple[int, int]:
    """[lo, hi] microseconds around the first crossing (its start, when it lasts long), or around the
    moment the peak (``RankTimeline.peak_curve``'s) was reached when nothing crossed."""
    run = max(rank.end_us - rank.start_us, 1)
    c = rank.first_crossing()
    if c is not None:
        a, b = c.time_us, c.time_us + min(max(c.duration_us, 1), run // 10)
    elif rank.oom is not None:  # nothing crossed, but it died: look at the moment it died
        a = b = rank.oom.time_us
    else:  # what the process held (PyTorch reserved + VMM), or allocated alone in a CPU profiler trace
        res = rank.peak_curve
        top = quantities.peak(res)
        a = top.time_us if len(res) else rank.start_us
        end = quantities.plateau_end(res, top.index) if len(res) else 0
        b = int(res.time_us[end]) if 0 < end < len(res) else rank.end_us  # while the peak lasted
        b = min(b, a + run // 10)
    width = max(b - a, 2_000)
    lo = max(a - int(1.5 * width), rank.start_us)
    hi = min(b + int(1.5 * width), rank.end_us)
    return lo, max(hi, lo + 1)


def _stack(ax, rank: RankTimeline, t0: int, lo: int, hi: int, n_buckets: int, handles: dict | None) -> None:
    alloc = rank.curves.allocated
    keep = bucket_indices(alloc.time_us, alloc.bytes, lo, hi, n_buckets)
    t = np.append(_s(alloc.time_us[keep], t0), _s(hi, t0))
    base = np.zeros(len(t))
    at_keep = rank.categories.at(keep)
    for k, name in enumerate(CATEGORIES):
        vals = np.maximum(at_keep[k], 0)
        if not vals.any():
            continue
        top = base + np.append(_g(vals, rank.unit), _g(vals[-1], rank.unit))
        art = ax.fill_between(t, base, top, step="post", color=COLORS[name], lw=0, alpha=0.9)
        if handles is not None:
            handles.setdefault(name, (art, LABELS[name]))
        base = top


def _vmm(ax, rank: RankTimeline, t0: int, lo: int, hi: int, n_buckets: int, handles: dict | None) -> None:
    """The KV cache committed through CUDA's VMM API: a hatched band in the KV cache's colour on top of
    PyTorch reserved (its top edged, so a band a few pixels wide still shows)."""
    band = vmm_band(rank, lo, hi, n_buckets)
    if band is None:
        return
    t, r, top = _s(band.time_us, t0), _g(band.reserved_bytes, rank.unit), _g(band.top_bytes, rank.unit)
    art = ax.fill_between(t, r, top, step="post", gid="vmm_kv", **VMM_KV_STYLE)
    ax.step(t, top, where="post", color=VMM_KV_EDGE, lw=0.9, zorder=1.5)
    if handles is not None:
        handles.setdefault("vmm_kv", (art, VMM_KV_LABEL))


def _lines(ax, rank: RankTimeline, t0: int, lo: int, hi: int, n_buckets: int, handles: dict | None) -> None:
    _vmm(ax, rank, t0, lo, hi, n_buckets, handles)
    if rank.holds_reserved:  # a CPU profiler trace has none (its 'Total Reserved' stays 0): no line at zero
        _reserved(ax, rank, t0, lo, hi, n_buckets, handles)
    _device_used_all(ax, rank, t0, lo, hi, n_buckets, handles)
    if not rank.curves.has_device:
        return
    used, nt = rank.curves.device_used, rank.curves.non_torch
    keep = bucket_indices(used.time_us, used.bytes, lo, hi, n_buckets)
    if not len(keep):
        return
    u, r = _g(used.bytes[keep], rank.unit), _g(used.bytes[keep] - nt.bytes[keep], rank.unit)
    ts = _s(used.time_us[keep], t0)
    if rank.cupti is None:
        band = ax.fill_between(ts, r, u, step="post", **NON_TORCH_STYLE)
        nt_label = quantities.NON_TORCH.label
        key, label = "non_torch", f"{nt_label} (NVML used - reserved" + (" - VMM)" if len(rank.curves.vmm) else ")")
    else:  # a run mixing ranks with and without CUPTI names both bands
        band = _cupti_bands(ax, cupti_split(rank, keep, lo, hi, n_buckets), t0, rank.unit, handles)
        key, label = "non_torch_unexplained", f"{quantities.NON_TORCH.label} unexplained (NVML used - reserved - CUPTI)"
    (dline,) = ax.step(ts, u, where="post", color="#B03030", lw=1.0, ls=(0, (4, 1.5)))
    if handles is not None:
        handles.setdefault(key, (band, label))
        shared = rank.curves.others.bytes.any()
        handles.setdefault("device_used", (dline, "NVML device used" + (" (this process)" if shared else "")))
    if rank.curves.others.bytes.any():
        top = _g(used.bytes[keep] + others_at(rank, used.time_us[keep]), rank.unit)
        art = ax.fill_between(ts, u, top, step="post", color=OTHERS, alpha=0.5, lw=0, hatch="..", edgecolor="#7A8A99")
        if handles is not None:
            label = f"{quantities.OTHERS.label} on the GPU (NVML)"
            if rank.others_off_scale:  # this process keeps its own scale: the card's fill runs above it
                label = f"{quantities.OTHERS.label} on the GPU (NVML), above the scale"
            handles.setdefault("others", (art, label))


def _reserved(ax, rank: RankTimeline, t0: int, lo: int, hi: int, n_buckets: int, handles: dict | None) -> None:
    """PyTorch reserved: a black step line."""
    res = rank.curves.reserved
    keep = bucket_indices(res.time_us, res.bytes, lo, hi, n_buckets)
    t = np.append(_s(res.time_us[keep], t0), _s(hi, t0))
    y = _g(np.append(res.bytes[keep], res.bytes[keep][-1]), rank.unit)
    (line,) = ax.step(t, y, where="post", color="black", lw=1.0)
    if handles is not None:
        handles.setdefault("reserved", (line, quantities.RESERVED.label))


def _device_used_all(ax, rank: RankTimeline, t0: int, lo: int, hi: int, n_buckets: int, handles: dict | None) -> None:
    """The whole device's used memory, where it was not told apart into this process's and others' (a line)."""
    c = rank.device_used_all
    if c is None:
        return
    keep = bucket_indices(c.time_us, c.bytes, lo, hi, n_buckets)
    if not len(keep):
        return
    t, y = _s(c.time_us[keep], t0), _g(c.bytes[keep], rank.unit)
    (line,) = ax.step(t, y, where="post", color=OTHERS_EDGE, lw=1.2, ls="-.")
    if handles is not None:
        label = f"{quantities.DEVICE_USED_ALL.label} (NVML; not told apart)"
        handles.setdefault("device_used_all", (line, label))


def _cupti_bands(ax, split: CuptiSplit, t0: int, unit: tuple[str, int], handles: dict | None):
    """What CUPTI saw on top of reserved (solid, its top edged so a thin band still shows), the rest up
    to device used hatched as the band without CUPTI; returns the hatched band's artist."""
    t, r = _s(split.time_us, t0), _g(split.reserved_bytes, unit)
    c, u = _g(split.cupti_top_bytes, unit), _g(split.used_bytes, unit)
    art = ax.fill_between(t, r, c, step="post", color=CUPTI, alpha=0.85, lw=0, gid="non_torch_cupti")
    ax.step(t, c, where="post", color=CUPTI_EDGE, lw=0.7, zorder=1.5)
    band = ax.fill_between(t, c, u, step="post", gid="non_torch_unexplained", **NON_TORCH_STYLE)
    if handles is not None:
        handles.setdefault("non_torch_cupti", (art, f"{quantities.NON_TORCH.label} seen by CUPTI (exact)"))
    return band


def others_at(rank: RankTimeline, t_us: np.ndarray) -> np.ndarray:
    """Other processes' bytes in force at each of ``t_us`` (their first figure before it was first read)."""
    o = rank.curves.others
    if not len(o):
        return np.zeros(len(t_us), dtype=np.int64)
    return o.bytes[np.clip(np.searchsorted(o.time_us, t_us, side="right") - 1, 0, None)]


def _hlines(ax, rank: RankTimeline, capacities, handles: dict) -> list[tuple[float, str, str]]:
    """Target, capacity and what-if lines; returns (y in the rank's unit, short label, colour) for the margin
    labels."""
    lines = []
    if rank.target_bytes is not None:
        legend = "utilization target"
        if rank.util and rank.capacity_bytes and abs(rank.util * rank.capacity_bytes - rank.target_bytes) < 2**20:
            legend += f" ({rank.util:g} x {format_gib(rank.capacity_bytes)})"  # only when it is the recorded one
        art = ax.axhline(_g(rank.target_bytes, rank.unit), color=TARGET, lw=1.4)
        handles.setdefault("target", (art, legend))
        lines.append((float(_g(rank.target_bytes, rank.unit)), f"target {format_gib(rank.target_bytes)}", TARGET))
    if rank.capacity_bytes and not _capacity_off_scale(rank, capacities):
        art = ax.axhline(_g(rank.capacity_bytes, rank.unit), color="black", lw=1.2, ls="--")
        handles.setdefault("capacity", (art, "card capacity"))
        lines.append((float(_g(rank.capacity_bytes, rank.unit)), f"card {format_gib(rank.capacity_bytes)}", "black"))
    elif rank.capacity_bytes:  # far above everything: say it in the legend, keep the scale for the data
        (art,) = ax.plot([], [], color="black", lw=1.2, ls="--")
        handles.setdefault("capacity", (art, f"card capacity {format_gib(rank.capacity_bytes, 1)} (off the scale)"))
    for cap in capacities:  # only the cards' sizes: whether each boots is ``memtrace fits``'s answer, not this curve's
        art = ax.axhline(_g(cap, rank.unit), color="#555555", lw=1.0, ls=":")
        handles.setdefault("what-if", (art, "--capacity card (fits says if it boots)"))
        lines.append((float(_g(cap, rank.unit)), f"card {format_gib(cap, 0)}", "#555555"))
    return lines


def _capacity_off_scale(rank: RankTimeline, capacities) -> bool:
    """True when the card is so much larger than what the run used that drawing it would squash the data."""
    return bool(rank.capacity_bytes) and rank.capacity_bytes > 1.6 * max([rank.top_bytes, *capacities])


def _label_hlines(ax, lines: list[tuple[float, str, str]], ymax: float, height_px: float) -> None:
    """Labels in the right margin, at their line's height; labels of lines closer than a text line
    are pushed apart (keeping their order) and joined to their line by a short stroke."""
    step = (LABEL_PT * DPI_HINT / 72 * 1.15) / max(height_px, 1.0) * ymax
    ys = sorted(lines, key=lambda x: x[0])
    placed: list[float] = []
    for y, _, _ in ys:  # bottom-up: each label at least one text line above the previous one
        placed.append(max(y, placed[-1] + step) if placed else y)
    overflow = placed[-1] - ymax + step / 2 if placed else 0.0
    if overflow > 0:  # pushed out of the top: shift the stack down as a whole
        placed = [p - overflow for p in placed]
    for (y, text, color), ty in zip(ys, placed, strict=True):
        ax.annotate(
            text,
            (1.0, y),
            xycoords=("axes fraction", "data"),
            xytext=(1.012, ty),
            textcoords=("axes fraction", "data"),
            va="center",
            ha="left",
            color=color,
            fontsize=LABEL_PT - 0.5,
            annotation_clip=False,
            arrowprops={"arrowstyle": "-", "color": color, "lw": 0.8, "shrinkA": 0, "shrinkB": 2}
            if abs(ty - y) > step / 4
            else None,
        )


def _box_corner(rank: RankTimeline, t0: int, scale: TimeScale, box_frac: float) -> tuple[str, float]:
    """Where the crossing's text box goes: the top-left, -centre or -right stretch of ``box_frac`` of
    the width whose data stays lowest; returns the corner and that data's top in the rank's unit."""
    best, best_top = "right", float("inf")
    res, used = rank.peak_curve, rank.curves.device_used
    w = min(box_frac, 1.0)
    for corner, (a, b) in (("left", (0.0, w)), ("right", (1.0 - w, 1.0)), ("center", (0.5 - w / 2, 0.5 + w / 2))):
        lo, hi = t0 + int(scale.at_fraction(a) * 1e6), t0 + int(scale.at_fraction(b) * 1e6)
        tops = [quantities.window_max(res, lo, hi)] if len(res) else [0]
        if len(used):
            tops.append(quantities.window_max(used, lo, hi))
        top = float(_g(max(tops), rank.unit))
        if top < best_top - 1e-9:
            best, best_top = corner, top
    return best, best_top


def _annotate(
    ax, rank, t0, scale: TimeScale, text: str, anchor: tuple[float, float], ymax: float, line_tops: list[float]
):
    """Put the annotation box in the emptiest top corner, its arrow to ``anchor``; returns (corner, new ymax)."""
    ext = ax.get_window_extent()
    char_px, line_px = LABEL_PT * DPI_HINT / 72 * 0.58, LABEL_PT * DPI_HINT / 72 * 1.3
    best = None
    # the text as written, then wrapped narrower: a narrow box may fit over a low stretch (start-up before its KV
    # cache) where a wide one would push the y axis far above the card to clear the data
    for width in (None, 44, 34):
        lines = text.split("\n") if width is None else [w for x in text.split("\n") for w in textwrap.wrap(x, width)]
        box_frac = (max(len(x) for x in lines) * char_px + 20) / max(ext.width, 1.0)
        box_hfrac = (len(lines) * line_px + 16) / max(ext.height, 1.0)
        corner, data_top = _box_corner(rank, t0, scale, box_frac)
        # the box may hide a stretch of the target/capacity lines (they run the whole width and are
        # labelled in the margin), never data; lines far below the data's top still count
        top = max([data_top, *[y for y in line_tops if y <= data_top * 1.05]])
        need = max(ymax, top / max(1.0 - box_hfrac - 0.05, 0.3))
        if best is None or need < best[0] * 0.98:
            best = (need, corner, "\n".join(lines))
    ymax, corner, text = best
    ax.annotate(
        text,
        anchor,
        xytext=({"left": 0.01, "center": 0.5, "right": 0.99}[corner], 0.97),
        textcoords="axes fraction",
        ha=corner,
        va="top",
        multialignment="left",
        fontsize=LABEL_PT,
        bbox={"boxstyle": "round,pad=0.35", "fc": "#FFF5F5", "ec": TARGET, "lw": 0.8},
        arrowprops={"arrowstyle": "->", "color": TARGET, "lw": 1.0},
        zorder=6,
    )
    return corner, ymax


def device_full(rank: RankTimeline) -> int | None:
    """The whole device's used memory at an OOM where the device itself ran out (CUDA's total less the free bytes
    torch's OOM observer was given, fewer than it asked for), on a device other processes shared; else None."""
    o, total = rank.oom, rank.device_total_bytes
    if o is None or not total or not o.device_ran_out:
        return None
    return total - o.free_bytes if rank.curves.others.bytes.any() else None


def _oom_point(rank: RankTimeline, t0: int) -> tuple[float, float]:
    """Where the OOM marker goes: at the OOM's moment, on device used (when sampled) or reserved; on the whole
    device's used memory where a shared device ran out (:func:`device_full`)."""
    t = rank.oom.time_us
    full = device_full(rank)
    if full is not None:  # on a card far above this process's own scale: at the scale's top
        return float(_s(t, t0)), float(
            _g(min(full, rank.top_bytes * 1.05) if rank.others_off_scale else full, rank.unit)
        )
    curve = rank.curves.device_used if rank.curves.has_device else rank.curves.reserved
    if rank.device_used_all is not None:  # this process's device used unknown: the whole device's
        curve = rank.device_used_all
    return float(_s(t, t0)), float(_g(max(curve.at(t), rank.peak_curve.at(t)), rank.unit))


def _mark_oom(ax, rank: RankTimeline, t0: int, t_end: int, handles: dict | None) -> None:
    """The OOM: a solid line at its moment, a cross on the curve, and the time after it greyed out
    (the run was dead or dying: nothing drawn there is part of the start-up)."""
    x, y = _oom_point(rank, t0)
    if rank.oom.time_us < t_end:
        ax.axvspan(x, _s(t_end, t0), color="#9E9E9E", alpha=0.22, lw=0, zorder=4, hatch="\\\\")
    line = ax.axvline(x, color=OOM_COLOR, lw=1.6, zorder=5)
    ax.plot([x], [y], marker="X", color=OOM_COLOR, ms=10, mec="white", mew=0.8, zorder=7)
    if handles is not None:
        handles.setdefault("oom", (line, "out of memory (after it: grey)"))


def draw_main(
    ax, rank, t0, t_end, crossing, capacities, window, handles, oom=None, scale: TimeScale | None = None
) -> str:
    """The main plot on the time axis ``scale`` (``timeline_scale``: broken where memory stayed flat; the
    identity when None); returns where the annotation box went ("" when none)."""
    _stack(ax, rank, t0, rank.start_us, rank.drawn_end_us, N_BUCKETS, handles)
    _lines(ax, rank, t0, rank.start_us, rank.drawn_end_us, N_BUCKETS, handles)
    win = rank.serving
    if win is not None:  # after the gap: the serving window, on the same axes
        _stack(ax, win, t0, win.start_us, win.end_us, N_BUCKETS, handles)
        _lines(ax, win, t0, win.start_us, win.end_us, N_BUCKETS, handles)
    hl = _hlines(ax, rank, capacities, handles)
    peaks = [rank.top_bytes, *capacities]  # the data's top (the window's and the target included): timeline_data
    if not _capacity_off_scale(rank, capacities):
        peaks.append(rank.capacity_bytes or 0)
    xmax_s = (t_end - t0) / 1e6
    scale = scale or identity(xmax_s)
    ax.set_xlim(0, xmax_s)
    for p in rank.phases:
        if p.depth == 0:
            ax.axvline(_s(p.start_us, t0), color="#999999", lw=0.6, alpha=0.6, zorder=0)
    ax.set_ylabel(rank.unit[0])
    ax.grid(axis="y", alpha=0.3)
    ymax = float(_g(max(peaks), rank.unit)) * 1.08 or 1.0
    if crossing is not None:
        ax.axvline(crossing.time_s, color=TARGET, lw=1.0, alpha=0.7, ls="-.")
        ax.plot(
            [_s(crossing.max_us, t0)], [_g(crossing.max_bytes, rank.unit)], marker="v", color=TARGET, ms=8, zorder=5
        )
    if oom is not None:
        _mark_oom(ax, rank.oom_rank, t0, rank.end_us, handles)
    texts = [d.text for d in (crossing, oom) if d is not None]
    corner = ""
    if texts:
        anchor = (
            (float(_s(crossing.max_us, t0)), float(_g(crossing.max_bytes, rank.unit)))
            if crossing is not None
            else _oom_point(rank.oom_rank, t0)
        )
        corner, ymax = _annotate(ax, rank, t0, scale, "\n".join(texts), anchor, ymax, [y for y, _, _ in hl])
    ax.set_ylim(0, ymax)
    _label_vmm(ax, rank, t0, scale)
    height_px = ax.get_window_extent().height
    _label_hlines(ax, hl, ymax, max(height_px, 1.0))
    lo, hi = window
    if zoom_band(rank, scale, t0, window):  # mark where the zoom panel looks (a sliver for milliseconds)
        band = ax.axvspan(_s(lo, t0), _s(hi, t0), color=ZOOM_BAND, alpha=0.5, lw=0, zorder=0)
        handles.setdefault("zoom", (band, "where the zoom panel looks"))
    mark_breaks(ax, scale, handles, None if rank.gap_us is None else rank.gap_dropped)
    return corner


def zoom_band(rank: RankTimeline, scale: TimeScale, t0: int, window: tuple[int, int] | None = None) -> bool:
    """Whether the main plot marks the zoom panel's window: only while it is narrow there (under a fifth of
    the drawn width; the broken axis may show a few seconds wide already)."""
    lo, hi = window or zoom_window(rank)
    return scale.fraction((hi - t0) / 1e6) - scale.fraction((lo - t0) / 1e6) < 0.2


def _label_vmm(ax, rank: RankTimeline, t0: int, scale: TimeScale) -> None:
    """Name the VMM band where it is highest: over minutes of start-up, a commit of a few milliseconds at the
    very end is a few pixels wide, so the label (left of it, half-way up) points at it."""
    kv = rank.vmm_kv
    if kv is None:
        return
    i = kv.peak_index
    t_us = int(kv.time_us[i])
    y = float(_g(rank.curves.reserved.at(t_us) + kv.peak_bytes / 2, rank.unit))
    x = float(_s(t_us, t0))
    text = f"KV cache committed through CUDA VMM\n(outside PyTorch): {format_gib(kv.peak_bytes)} at {x:.2f} s"
    right = scale.fraction(x) > 0.5
    ax.annotate(
        text,
        (x, y),
        xytext=(-14 if right else 14, 0),
        textcoords="offset points",
        ha="right" if right else "left",
        va="center",
        fontsize=LABEL_PT - 0.5,
        color=VMM_KV_EDGE,
        bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": VMM_KV_EDGE, "lw": 0.6, "alpha": 0.9},
        arrowprops={"arrowstyle": "->", "color": VMM_KV_EDGE, "lw": 1.0},
        zorder=6,
    )


def draw_zoom(ax, rank: RankTimeline, t0: int, window: tuple[int, int], crossing) -> str:
    """The window around the crossing (or the peak), x in milliseconds (or seconds) from its start; returns its
    title."""
    from matplotlib.ticker import MaxNLocator

    lo, hi = window
    res = rank.peak_curve  # PyTorch reserved + VMM (0.34+); allocated alone in a CPU profiler trace
    if crossing is not None:
        origin = crossing.time_us
    elif rank.oom is not None:
        origin = rank.oom.time_us
    else:
        origin = int(res.time_us[max(res.peak_index, 0)])
    full = device_full(rank) if crossing is None else None
    full = full if full is not None and lo <= rank.oom.time_us <= hi else None
    if full is None:
        _stack(ax, rank, t0, lo, hi, 600, None)
        _lines(ax, rank, t0, lo, hi, 600, None)
    in_s = hi - lo > 5_000_000
    unit = 1e6 if in_s else 1e3
    rel = MaxNLocator(4, steps=[1, 2, 5, 10]).tick_values((lo - origin) / unit, (hi - origin) / unit)
    rel = [r for r in rel if lo <= origin + r * unit <= hi]
    ax.set_xticks([_s(origin + r * unit, t0) for r in rel])
    ax.set_xticklabels([f"{r:+g}" if r else "0" for r in rel])
    ax.set_xlim(_s(lo, t0), _s(hi, t0))
    ax.set_xlabel(f"{'s' if in_s else 'ms'} from {(origin - t0) / 1e6:.3f} s")
    values = [quantities.window_max(res, lo, hi)]
    if rank.curves.has_device:
        values.append(quantities.window_max(rank.curves.device_used, lo, hi))
    if rank.device_used_all is not None:
        values.append(quantities.window_max(rank.device_used_all, lo, hi))
    if rank.target_bytes is not None:
        ax.axhline(_g(rank.target_bytes, rank.unit), color=TARGET, lw=1.4)
        values.append(rank.target_bytes)
    if full is not None:  # the device ran out: its last MiBs, the request on top
        return _zoom_device_full(ax, rank, t0, lo, hi, full)
    top = float(_g(max(values), rank.unit))
    # the y range follows the peak moment itself (not the padding around it), so a jump just before
    # it (the KV cache being allocated) does not squash the crossing into a few pixels
    focus = [rank.curves.allocated.at(crossing.max_us if crossing is not None else origin)]
    if rank.target_bytes is not None:
        focus.append(rank.target_bytes)
    bottom = float(_g(min(focus), rank.unit))
    span = max(top - bottom, 0.5)
    if rank.unit[0] == "GiB":
        ax.set_ylim(max(bottom - 0.6 * span, 0), top + 0.25 * span)
    else:  # a few MiB or KiB in all (a CPU profiler trace): from zero, as the main plot
        ax.set_ylim(0, top * 1.25 or 1.0)
    ax.yaxis.tick_right()
    ax.grid(alpha=0.3)
    if crossing is not None:
        ax.axvline(crossing.time_s, color=TARGET, lw=1.0, alpha=0.7, ls="-.")
        ax.plot([_s(crossing.max_us, t0)], [_g(crossing.max_bytes, rank.unit)], marker="v", color=TARGET, ms=8)
        ax.text(0.02, 0.97, format_gib(crossing.max_bytes), transform=ax.transAxes, va="top", color=TARGET)
    elif rank.oom is None:
        ax.text(0.02, 0.97, f"peak {format_size(res.peak_bytes)}", transform=ax.transAxes, va="top")
    if rank.oom is not None and lo <= rank.oom.time_us <= hi:
        _mark_oom(ax, rank, t0, hi, None)
    peak = f"zoom: peak {rank.peak_name}"
    title = "zoom: first crossing" if crossing is not None else "zoom: the OOM" if rank.oom else peak
    ax.set_title(title, fontsize="medium", loc="left")
    ax.set_facecolor("#FFFBEA")
    return title


def _zoom_device_full(ax, rank: RankTimeline, t0: int, lo: int, hi: int, full: int) -> str:
    """The zoom panel of an OOM where a shared device ran out (:func:`device_full`): the y axis spans the device's
    last MiBs (MiB from the card's total), so the failed request (a few MiB beside a card of a hundred GiB) is seen
    not to fit: the whole device's used memory (the top of the other processes' band), the card, the free bytes and
    the request drawn from the used memory up."""
    from matplotlib.patches import Rectangle

    o, total = rank.oom, rank.device_total_bytes
    req, mib = o.requested_bytes, 2**20
    pad = max(req, o.free_bytes, 4 * mib)
    bottom = -6 * pad / mib
    ax.set_ylim(bottom, 2.5 * pad / mib)
    ax.yaxis.tick_right()
    used, others = rank.curves.device_used, rank.curves.others
    t = np.union1d(used.time_us[(used.time_us >= lo) & (used.time_us <= hi)], [lo, o.time_us, hi]).astype(np.int64)
    whole = used.at_each(t, first_before=True) + others.at_each(t, first_before=True)
    whole[t >= o.time_us] = full  # exact at the OOM (CUDA's free bytes), as the report says it
    x, y = _s(t, t0), (whole - total) / mib
    ax.fill_between(x, bottom, y, step="post", color=OTHERS, alpha=0.5, lw=0, hatch="..", edgecolor="#7A8A99")
    ax.step(x, y, where="post", color=OTHERS_EDGE, lw=1.2)
    ax.axhline(0, color="black", lw=1.2, ls="--")
    xo, width = float(_s(o.time_us, t0)), (hi - lo) / 1e6 / 12
    y0 = (full - total) / mib
    ax.add_patch(Rectangle((xo, y0), width, req / mib, facecolor="#FFCDD2", edgecolor=OOM_COLOR, hatch="//", lw=1.0,
                           zorder=6))  # fmt: skip
    ax.annotate(f"requested {format_size(req)}", (xo + width / 2, y0 + req / mib), xytext=(0, 4),
                textcoords="offset points", ha="center", va="bottom", fontsize=LABEL_PT - 1.5, color=OOM_COLOR)  # fmt: skip
    ax.annotate(f"free {format_size(o.free_bytes)}", (xo, y0 + o.free_bytes / 2 / mib), xytext=(-6, 0),
                textcoords="offset points", ha="right", va="center", fontsize=LABEL_PT - 1.5)  # fmt: skip
    ax.text(0.02, 0.03, "whole device used\n(all processes)", transform=ax.transAxes, va="bottom",
            fontsize=LABEL_PT - 2, color=OTHERS_EDGE)  # fmt: skip
    ax.axvline(xo, color=OOM_COLOR, lw=1.6, zorder=5)
    ax.grid(alpha=0.3)
    ax.yaxis.set_major_formatter(lambda v, _: "card" if v == 0 else f"{v:+g}")  # MiB from the card's total
    title = "zoom: the OOM, in MiB"
    ax.set_title(title, fontsize="medium", loc="left")
    ax.set_facecolor("#FFFBEA")
    return title
