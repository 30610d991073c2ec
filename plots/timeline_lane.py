"""The timeline's phase lane: one bar row per nesting depth above the memory plot, each bar named.

Called by ``timeline.render_timeline`` with matplotlib already imported. Where each name goes is decided by
``phase_lane.place_labels`` in *drawn* seconds (``timeline_scale.TimeScale.forward``: the broken axis's
widths, the very pixels the names must fit), then drawn back at seconds since t0 (the axis's own data).
"""

from __future__ import annotations

from memtrace.plots.phase_lane import TICK_GAP_PX, PhaseBar, PhaseLabel, place_labels
from memtrace.plots.timeline_data import RankTimeline
from memtrace.plots.timeline_scale import TimeScale

LANE_COLORS = ("#DDE3EA", "#C9D3DE")


def _drawn(scale: TimeScale, t_us: int, t0: int) -> float:
    return float(scale.forward((t_us - t0) / 1e6))


def layout_lane(
    rank: RankTimeline,
    t0: int,
    scale: TimeScale,
    px_per_s: float,
    char_px: float,
    x_max: float = float("inf"),
    must_label: frozenset[str] = frozenset(),
) -> list[PhaseLabel]:
    """Where each phase's name goes (``phase_lane.place_labels``), in drawn seconds: ``px_per_s`` is pixels
    per drawn second, ``x_max`` the figure's right edge in drawn seconds. ``must_label``: the paths of the
    phases a landmark (the peak, the crossing, the OOM) falls in, whose names are placed first."""
    bars = [PhaseBar(p.path, p.name, p.depth, _drawn(scale, p.start_us, t0), _drawn(scale, p.end_us, t0))
            for p in rank.lane_phases]  # fmt: skip
    x_min = _drawn(scale, rank.start_us, t0)
    return place_labels(bars, px_per_s, char_px, x_min=x_min, x_max=x_max, first=must_label)


def overflow_rows(labels: list[PhaseLabel]) -> int:
    """How many overflow rows the labels use above the lane."""
    return max([lab.row + 1 for lab in labels if lab.where == "above"], default=0)


def lane_rows(rank: RankTimeline, labels: list[PhaseLabel]) -> int:
    """Rows of the phase lane: one per depth, then the overflow rows."""
    return max([p.depth for p in rank.lane_phases], default=-1) + 1 + overflow_rows(labels)


def draw_lane(
    ax, rank: RankTimeline, t0: int, scale: TimeScale, labels: list[PhaseLabel], show_rank: bool,
    label_pt: float = 11.0,
) -> None:  # fmt: skip
    """Phase bars, one row per depth (outermost on top), and the names ``layout_lane`` placed: in their row,
    or in the overflow rows on top, joined to their bar by a vertical tick."""
    rows = max([p.depth for p in rank.lane_phases], default=-1) + 1
    for i, p in enumerate(sorted(rank.lane_phases, key=lambda p: (p.depth, p.start_us))):
        y = rows - 1 - p.depth
        a, b = (p.start_us - t0) / 1e6, (p.end_us - t0) / 1e6
        ax.broken_barh([(a, max(b - a, 0))], (y + 0.08, 0.84), color=LANE_COLORS[i % 2])
    back = scale.inverse
    for lab in labels:
        if lab.where == "above":
            y, top_of_bar = rows + 0.5 + lab.row, rows - lab.depth - 0.08
            x_tick = float(back(lab.anchor_s))
            ax.plot([x_tick, x_tick], [top_of_bar, y], color="#777777", lw=0.7)
            right = lab.x_s >= lab.anchor_s  # the name starts right of its tick, else ends left of it
            gap = TICK_GAP_PX * scale.span_s / max(ax.get_window_extent().width, 1.0)
            x = float(back(lab.anchor_s + gap if right else lab.anchor_s - gap))
            ax.text(x, y, lab.text, ha="left" if right else "right", va="center", fontsize=label_pt)
        else:
            y = rows - 1 - lab.depth + 0.5
            ha = "center" if lab.inside else "left"
            ax.text(float(back(lab.x_s)), y, lab.text, ha=ha, va="center", fontsize=label_pt)
    ax.set_ylim(0, max(rows, 1) + overflow_rows(labels))
    ax.set_yticks([])
    ax.tick_params(labelbottom=False, bottom=False)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    label = rank.label if show_rank else "phases" if rank.lane_phases else ""  # no phases: no empty label
    margin_px = ax.get_position().x0 * ax.figure.bbox.width
    if len(label) * label_pt * ax.figure.dpi / 72 * 0.6 > margin_px:  # "host (CPU) of rank 0": above the lane
        ax.set_title(label, loc="left", fontsize=label_pt, pad=2)
        label = "phases"
    ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=label_pt)
    ax.yaxis.set_label_coords(-0.005, rows / 2 / (max(rows, 1) + overflow_rows(labels)))  # beside the bars
