"""The broken time axis as drawn on the main plot: each squeezed stretch a pale band over the curves with its
length written in it, a pair of slashes on the axis, round ticks in the busy stretches (``timeline_scale``).

Called by ``timeline_axes.draw_main`` with matplotlib already imported.
"""

from __future__ import annotations

from .timeline_scale import TimeScale, ticks

BREAK_FILL = "#F2F2F2"
LABEL_PT = 11.0  # as timeline_axes.LABEL_PT


def mark_breaks(ax, scale: TimeScale, handles: dict | None) -> None:
    """Each squeezed stretch of the time axis: a pale band over the curves (drawn through it, compressed),
    its length written in it, a pair of slashes on the time axis; round ticks in the busy stretches."""
    import matplotlib.transforms as mtransforms

    width_px = ax.get_window_extent().width
    ax.set_xticks(ticks(scale, width_px))
    ax.xaxis.set_major_formatter("{x:g}")
    if not scale.breaks:
        return
    blend = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    for a, b in scale.breaks:
        art = ax.axvspan(a, b, color=BREAK_FILL, alpha=0.8, lw=0, zorder=2.5)
        ax.text((float(scale.inverse((scale.forward(a) + scale.forward(b)) / 2))), 0.5, f"{_length(b - a)} flat",
                transform=blend, rotation=90, ha="center", va="center", fontsize=LABEL_PT - 1.5, color="#555555",
                zorder=2.6)  # fmt: skip
        for x in (a, b):
            off = mtransforms.offset_copy(blend, fig=ax.figure, x=0, y=0, units="points")
            ax.text(x, 0.0, "/", transform=off, ha="center", va="center", fontsize=LABEL_PT + 2,
                    fontweight="bold", color="#333333", clip_on=False, zorder=8)  # fmt: skip
    if handles is not None:
        handles.setdefault("break", (art, "time axis squeezed: memory flat there"))


def _length(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
