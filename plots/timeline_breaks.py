"""The broken time axis as drawn on the main plot: each squeezed stretch a pale band over the curves with its
length written in it, a pair of slashes on the axis, round ticks in the busy stretches (``timeline_scale``).

Called by ``timeline_axes.draw_main`` with matplotlib already imported.
"""

from __future__ import annotations

from memtrace.plots.timeline_scale import TimeScale, ticks

BREAK_FILL = "#F2F2F2"
GAP_EDGE = "#BBBBBB"
LABEL_PT = 11.0  # as timeline_axes.LABEL_PT


def mark_breaks(ax, scale: TimeScale, handles: dict | None, gap_dropped: tuple[int, int, int] | None = None) -> None:
    """Each squeezed stretch of the time axis: a pale band over the curves (drawn through it, compressed),
    its length written in it, a pair of slashes on the time axis; round ticks in the busy stretches. A gap in
    the record (``scale.gaps``: a serving window's dropped time) is an opaque hatched band hiding the curves,
    with ``gap_label`` written in it (its length and what the ring dropped, ``gap_dropped``): memory
    there is unknown, never drawn flat."""
    import matplotlib.transforms as mtransforms

    width_px = ax.get_window_extent().width
    ax.set_xticks(ticks(scale, width_px))
    ax.xaxis.set_major_formatter("{x:g}")
    if not scale.breaks:
        return
    blend = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    art = gap = None
    for a, b in scale.breaks:
        is_gap = (a, b) in scale.gaps
        mid = float(scale.inverse((scale.forward(a) + scale.forward(b)) / 2))
        if is_gap:
            gap = ax.axvspan(a, b, facecolor="white", edgecolor=GAP_EDGE, hatch="xx", lw=0, zorder=4.4)
            text = "\n".join(gap_label(b - a, gap_dropped))
            ax.text(mid, 0.5, text, transform=blend, rotation=90, ha="center", va="center", fontsize=LABEL_PT - 2.5,
                    color="#333333", zorder=4.5, bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0})  # fmt: skip
            continue
        art = ax.axvspan(a, b, color=BREAK_FILL, alpha=0.8, lw=0, zorder=2.5)
        ax.text(mid, 0.5, f"{length_text(b - a)} flat",
                transform=blend, rotation=90, ha="center", va="center", fontsize=LABEL_PT - 1.5, color="#555555",
                zorder=2.6)  # fmt: skip
        for x in (a, b):
            off = mtransforms.offset_copy(blend, fig=ax.figure, x=0, y=0, units="points")
            ax.text(x, 0.0, "/", transform=off, ha="center", va="center", fontsize=LABEL_PT + 2,
                    fontweight="bold", color="#333333", clip_on=False, zorder=8)  # fmt: skip
    if handles is not None and art is not None:
        handles.setdefault("break", (art, "time axis squeezed: memory flat there"))
    if handles is not None and gap is not None:
        handles.setdefault("gap", (gap, "gap: not recorded (dropped from the serving ring)"))


def length_text(seconds: float) -> str:
    """A squeezed stretch's length as its band says it (the plot's and the view's gap too)."""
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    if seconds < 0.1:  # a CPU profiler trace squeezes milliseconds: never "0.0 s"
        return f"{seconds * 1e3:.1f} ms" if seconds < 0.01 else f"{seconds * 1e3:.0f} ms"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def gap_label(seconds: float, dropped: tuple[int, int, int] | None) -> list[str]:
    """What the gap's hatched band says, a line each, in the plot and the view: "GAP" and its length, that it was
    not recorded and what the ring dropped of it (allocator events, NVML samples, scheduler steps; None: unsaid)."""
    lines = [f"GAP {length_text(seconds)}"]
    if dropped is not None:
        events, samples, steps = dropped
        lines += ["not recorded; dropped:", f"{events:,} events, {samples:,} samples, {steps:,} steps"]
    return lines
