"""The start-up timeline: GPU memory over time, by category, with the target and the first crossing.

One row per process (rank), on one time axis (seconds since the earliest start). Each row has:

- a phase lane above the plot: one bar row per nesting depth, labels that never overlap
  (``phase_lane``);
- the main plot: PyTorch allocated memory stacked by category (``analysis.categories``), the
  reserved line, NVML device-used as a line, the non-PyTorch band between them (when the trace holds
  CUPTI records: what CUPTI saw, exactly, on top of reserved, then the unexplained rest), the
  utilization target and the physical capacity (plus the card sizes asked with --capacity) as horizontal lines, and
  the first crossing of the target marked and annotated (time, phase, peak, overshoot, duration);
- a zoom panel on the right around that crossing (or the peak), so a crossing that lasts
  milliseconds in a run of minutes is still visible.

Curves are thinned per pixel bucket keeping their extremes (``downsample``), so a million events
plot in seconds without losing the peak. matplotlib (Agg) is imported inside the functions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from memtrace.analysis.memory import quantities
from memtrace.analysis.memory.categories import CATEGORIES
from memtrace.plots import oom_text as oom_words
from memtrace.plots.phase_lane import PhaseLabel
from memtrace.plots.timeline_axes import DPI_HINT, LABEL_PT, draw_main, draw_zoom, zoom_band, zoom_window
from memtrace.plots.timeline_data import RankTimeline, drawn_curves, landmark_times_us, phases_at
from memtrace.plots.timeline_lane import draw_lane, lane_rows, layout_lane
from memtrace.plots.timeline_scale import FLAT_FRAC, MIN_QUIET_FRAC, TimeScale, quiet_stretches, time_scale
from memtrace.units import format_gib

WIDTH_IN = 12.5
DPI = DPI_HINT
MAIN_H_IN = 3.4
LANE_ROW_IN = 0.27
FONT = 12.0


@dataclass(frozen=True)
class CrossingDrawn:
    """The crossing the timeline annotated (``analysis.crossing``), in the drawing's and the trace's units."""

    curve: str  # "device_used" or "reserved"
    time_us: int  # the first moment above the target
    time_s: float  # the same, in seconds since the drawing's t0
    phase_path: str
    at_cross_bytes: int  # the curve's value at the crossing
    max_bytes: int  # the excursion's maximum
    max_us: int  # when the excursion reached max_bytes
    overshoot_bytes: int
    duration_us: int
    until: str  # "dropped", "end" or "oom"
    text: str


@dataclass(frozen=True)
class OomDrawn:
    """The OOM marked on the timeline (``analysis.oom.find_oom``)."""

    time_us: int
    time_s: float
    phase_path: str
    requested_bytes: int
    free_bytes: int | None
    text: str


@dataclass(frozen=True)
class RankDrawn:
    """What was drawn for one rank."""

    label: str
    target_bytes: int | None
    capacity_bytes: int | None
    crossing: CrossingDrawn | None
    zoom_us: tuple[int, int]
    phase_labels: list[PhaseLabel]
    annotation_corner: str  # where the crossing's text box went: "left", "center", "right", or ""
    lane_px_per_s: float = 0.0  # the scale the phase labels were laid out with (pixels per drawn second)
    lane_char_px: float = 0.0
    oom: OomDrawn | None = None
    annotation: str = ""  # the whole text of the annotation box
    y_unit: str = "GiB"  # the main plot's and the zoom's y unit (``RankTimeline.unit``)
    zoom_title: str = ""  # what the zoom panel looks at ("zoom: peak allocated" for a CPU profiler trace)
    y_top: float = 0.0  # the main plot's y axis's top, in ``y_unit``
    panels: int = 2  # the main plot and the zoom; 1 for a snapshot of one moment (no zoom)
    lane_label: str = ""  # the phase lane's label ("phases"; "" on a trace without phases)
    x_label: str = ""  # the main plot's x label ("" above the last rank)


@dataclass(frozen=True)
class TimelineDrawn:
    """What ``render_timeline`` drew: the file, the shared time origin and each rank's figures."""

    path: Path
    t0_us: int
    ranks: list[RankDrawn]
    title: str = ""
    legend: list[str] = field(default_factory=list)  # the legend's entries, in order
    footnote: str = ""  # the line under the figure: the time origin
    #: the quiet stretches the time axis squeezes, in seconds since t0 (``timeline_scale``); () when unbroken
    breaks: tuple[tuple[float, float], ...] = ()
    scale: TimeScale | None = None


def _phase_name(path: str) -> str:
    parts = path.split("/")
    return path if len(path) <= 44 or len(parts) < 3 else ".../" + "/".join(parts[-2:])


def duration_text(us: int) -> str:
    """ "250 µs", "3.5 ms", "35 ms", "2.50 s", "12.3 s" """
    if us < 1000:
        return f"{us} µs"
    if us < 10_000:
        return f"{us / 1000:.1f} ms"
    if us < 1_000_000:
        return f"{us / 1000:.0f} ms"
    return f"{us / 1e6:.2f} s" if us < 10_000_000 else f"{us / 1e6:.1f} s"


def _in_phase(path: str) -> str:
    return f"in {_phase_name(path)}" if path else "outside any phase"


_UNTIL = {"dropped": "", "end": ", until the end of the recording", "oom": ", until the OOM"}


def crossing_text(rank: RankTimeline, t0_us: int) -> CrossingDrawn | None:
    """The annotation for the first crossing of ``rank``'s target, or None when it never crossed.

    The crossing's moment and value, and the excursion's maximum (value and moment), are separate
    lines; the other curve's crossing (or that it stayed below) follows.
    """
    c = rank.first_crossing()
    if c is None:
        return None
    sec = (c.time_us - t0_us) / 1e6
    lines = [
        f"{c.name} crossed the {format_gib(c.target_bytes)} target",
        f"at {sec:.3f} s {_in_phase(c.phase_path)}: {format_gib(c.at_cross_bytes)}",
        f"highest {format_gib(c.max_bytes)} (+{format_gib(c.overshoot_bytes)}) at {(c.max_us - t0_us) / 1e6:.3f} s",
        f"above it for {duration_text(c.duration_us)}{_UNTIL[c.until]}"
        + (f" (the first of {c.excursions} excursions)" if c.excursions > 1 else ""),
    ]
    other = rank.crossings.second if rank.crossings is not None else None
    if other is not None:
        lines.append(
            f"{other.name} crossed at {(other.time_us - t0_us) / 1e6:.3f} s, highest "
            f"{format_gib(other.max_bytes)} (+{format_gib(other.overshoot_bytes)})"
        )
    elif c.curve == "device_used":
        lines.append(
            f"{quantities.RESERVED.label} stayed below it (highest {format_gib(rank.crossings.reserved_max_bytes)})"
        )
    return CrossingDrawn(
        curve=c.curve,
        time_us=c.time_us,
        time_s=sec,
        phase_path=c.phase_path,
        at_cross_bytes=c.at_cross_bytes,
        max_bytes=c.max_bytes,
        max_us=c.max_us,
        overshoot_bytes=c.overshoot_bytes,
        duration_us=c.duration_us,
        until=c.until,
        text="\n".join(lines),
    )


def oom_text(rank: RankTimeline, t0_us: int) -> OomDrawn | None:
    """The OOM's marker text: when, where, what was asked for and what was free."""
    o = rank.oom
    if o is None:
        return None
    sec = (o.time_us - t0_us) / 1e6
    head = f"OUT OF MEMORY at {sec:.3f} s {_in_phase(o.phase_path)}"
    detail = oom_words.details(o, rank.device_total_bytes)
    return OomDrawn(o.time_us, sec, o.phase_path, o.requested_bytes, o.free_bytes, f"{head}\n{detail}")


def axis_scale(ranks: list[RankTimeline], t0: int, t_end: int) -> TimeScale:
    """The time axis: broken where every rank's memory stayed flat for long (``timeline_scale``)."""
    curves = [c for r in ranks for c in drawn_curves(r) if len(c)]
    top = max([c.peak_bytes for c in curves] + [r.target_bytes or 0 for r in ranks] + [1])
    marks = [t for r in ranks for p in r.phases for t in (p.start_us, p.end_us)]
    marks += [t for r in ranks for t in landmark_times_us(r)]
    start = min(r.start_us for r in ranks)
    quiet = quiet_stretches(
        [(c.time_us, c.bytes) for c in curves], marks, start, t_end, FLAT_FRAC * top, MIN_QUIET_FRAC * (t_end - t0)
    )
    # a serving window keeps its own width: its growth is small beside start-up's, so at start-up's scale every
    # second of it would read as flat and be squeezed into a sliver
    windows = [r.window_us for r in ranks if r.window_us is not None]
    quiet = [(a, b) for a, b in quiet if not any(a < w1 and b > w0 for w0, w1 in windows)]
    gaps = [r.gap_us for r in ranks if r.gap_us is not None]
    return time_scale(quiet, t0, t_end, gaps)


def render_timeline(
    ranks: list[RankTimeline],
    path: str | os.PathLike,
    *,
    capacities: list[int] | tuple[int, ...] = (),
    title: str | None = None,
    t0_us: int | None = None,
    footnote: str = "",
) -> TimelineDrawn:
    """Draw the timeline of one or more ranks into ``path`` (.png or .svg, by suffix).

    Args:
        ranks: prepared ranks (``timeline_data.prepare_rank``), drawn top to bottom.
        path: the output file.
        capacities: card sizes asked (--capacity) in bytes, drawn as dotted lines: their sizes only (whether each boots is ``memtrace fits``'s answer).
        title: the figure's title (default: what the first rank's trace recorded it ran, with what, on what).
        t0_us: the run's time origin (``analysis.origin.TimeOrigin.t0_us``; default: the earliest start).
        footnote: a line under the figure (the time origin's sentence).
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    if not ranks:
        raise ValueError("render_timeline needs at least one rank")
    t0 = min(r.start_us for r in ranks) if t0_us is None else t0_us
    t_end = max(r.end_us for r in ranks)
    scale = axis_scale(ranks, t0, t_end)
    with plt.rc_context({"font.size": FONT, "axes.titlesize": FONT + 1, "svg.fonttype": "none"}):
        foot_in = FOOTNOTE_IN if footnote else 0.0
        fig, gs = _figure(plt, ranks, foot_in, scale, t0)
        lanes = _lay_out_lanes(fig, gs, ranks, t0, scale)
        _fit_heights(fig, gs, ranks, lanes, foot_in, scale, t0)
        main_axes: list = []
        handles: dict = {}
        drawn = [_draw_rank(fig, gs, i, ranks, t0, t_end, capacities, main_axes, handles, scale, lanes[i])
                 for i in range(len(ranks))]  # fmt: skip
        if all(r.one_moment for r in ranks):  # a snapshot of one moment: no time to put on an axis
            main_axes[-1].set_xlabel(ONE_MOMENT_AXIS)
        else:
            main_axes[-1].set_xlabel(
                "seconds since start" + (" (the start: 'Times' under the figure)" if footnote else "")
            )
        drawn[-1] = replace(drawn[-1], x_label=main_axes[-1].get_xlabel())
        for ax in main_axes[:-1]:
            ax.tick_params(labelbottom=False)
        if "target" in handles and len({(r.util, r.capacity_bytes) for r in ranks}) > 1:
            handles["target"] = (handles["target"][0], "utilization target (each rank's own)")
        legend = _legend(fig, handles, _legend_rows(ranks, scale, t0), lift_in=FOOTNOTE_IN if footnote else 0.0)
        if footnote:
            fig.text(0.06, 0.06 / fig.get_figheight(), footnote, ha="left", va="bottom", fontsize=FONT - 3,
                     color="#444444")  # fmt: skip
        what = ranks[0].description
        head = "GPU memory during start-up" + (" and serving" if any(r.serves for r in ranks) else "")
        title = title or (head + (f": {what}" if what else ""))
        fig.suptitle(_fit_title(title, fig.get_figwidth(), FONT + 3), x=0.06, ha="left", fontsize=FONT + 3,
                     fontweight="bold")  # fmt: skip
        out = Path(path)
        fig.savefig(out, dpi=DPI, format=out.suffix.lstrip(".").lower() or "png")
        plt.close(fig)
    return TimelineDrawn(out, t0, drawn, title, legend, footnote, scale.breaks, scale)


def _lane_geometry(fig, gs, scale: TimeScale) -> tuple[float, float]:
    """(pixels per drawn second, the figure's right edge in drawn seconds) of the lanes (column 0), known
    from the grid before any axes exist (the width does not depend on the heights)."""
    _, _, lefts, rights = gs.get_grid_positions(fig)
    width_px = (rights[0] - lefts[0]) * fig.bbox.width
    px_per_s = width_px / scale.span_s
    return px_per_s, (1.0 - lefts[0]) * fig.bbox.width / px_per_s


def _lay_out_lanes(fig, gs, ranks, t0: int, scale: TimeScale) -> list[list[PhaseLabel]]:
    px_per_s, x_max = _lane_geometry(fig, gs, scale)
    return [layout_lane(r, t0, scale, px_per_s, CHAR_PX, x_max, phases_at(r, landmark_times_us(r))) for r in ranks]


def _draw_rank(fig, gs, i: int, ranks, t0: int, t_end: int, capacities, main_axes: list, handles: dict,
               scale: TimeScale, labels: list[PhaseLabel]) -> RankDrawn:  # fmt: skip
    """Rank ``i``'s phase lane, main plot and zoom, in grid rows 3i+1 and 3i+2; appends its main axes."""
    rank = ranks[i]
    share = main_axes[0] if main_axes else None
    lane_ax = fig.add_subplot(gs[3 * i + 1, 0], sharex=share)
    main_ax = fig.add_subplot(gs[3 * i + 2, 0], sharex=share)
    if share is None:
        for ax in (lane_ax, main_ax):
            ax.set_xscale("function", functions=(scale.forward, scale.inverse))
    main_axes.append(main_ax)
    crossing, oom = crossing_text(rank, t0), oom_text(rank, t0)
    zoomed = rank.oom_rank if rank.serving is not None and (rank.serving.oom or crossing is None) else rank
    zoomed = rank.serving if zoomed is rank and rank.serving is not None and crossing is None else zoomed
    window = zoom_window(zoomed)
    draw_lane(lane_ax, rank, t0, scale, labels, len(ranks) > 1, LABEL_PT)
    corner = draw_main(main_ax, rank, t0, t_end, crossing, capacities, window, handles, oom, scale)
    zoom_title = ""
    if rank.one_moment:  # one moment: no time axis to read, nothing to zoom into
        main_ax.set_xticks([])
        main_ax.text(0.5, 0.5, ONE_MOMENT_TEXT, transform=main_ax.transAxes, ha="center", va="center",
                     fontsize=LABEL_PT, bbox={"boxstyle": "round,pad=0.4", "fc": "white", "ec": "#777777"})  # fmt: skip
    else:
        zoom_ax = fig.add_subplot(gs[3 * i + 2, 1])
        zoom_title = draw_zoom(zoom_ax, zoomed, t0, window, crossing if zoomed is rank else None)
    lane_ax.set_xlim((0, (t_end - t0) / 1e6))
    annotation = "\n".join(d.text for d in (crossing, oom) if d is not None)
    px_per_s, _ = _lane_geometry(fig, gs, scale)
    return RankDrawn(rank.label, rank.target_bytes, rank.capacity_bytes, crossing, window, labels, corner,
                     px_per_s, CHAR_PX, oom, annotation, rank.unit[0], zoom_title, float(main_ax.get_ylim()[1]),
                     2 if zoom_title else 1, lane_ax.get_ylabel())  # fmt: skip


#: A snapshot of one moment (``quantities.is_one_moment``) drawn without a time axis: its x label, and its words.
ONE_MOMENT_AXIS = "one moment: an allocator snapshot holds no history, so there is no time axis"
ONE_MOMENT_TEXT = "one moment (allocator state, no history)"
CHAR_PX = LABEL_PT * DPI / 72 * 0.6  # DejaVu Sans: about 0.55-0.6 em a glyph
FOOTNOTE_IN = 0.3  # the time origin's line under the legend
LEGEND_ROWS = 3  # one more when an OOM or other processes add their entries, one more for CUPTI's, for VMM's
RANK_GAP_IN = 0.45
TITLE_IN = 0.55


def _legend_rows(ranks: list[RankTimeline], scale: TimeScale | None = None, t0: int = 0) -> int:
    extra = any(r.oom is not None or r.curves.others.bytes.any() for r in ranks)
    cupti = any(r.cupti is not None for r in ranks)
    vmm = any(r.vmm_kv is not None for r in ranks)
    axis = scale is not None and (bool(scale.breaks) or any(zoom_band(r, scale, t0) for r in ranks))
    return LEGEND_ROWS + (1 if extra else 0) + (1 if cupti else 0) + (1 if vmm else 0) + (1 if axis else 0)


def _legend_in(rows: int) -> float:
    return 0.55 + 0.3 * rows  # the x-axis label, then the legend's rows


def _heights(ranks: list[RankTimeline], rows: list[int], footnote_in: float, scale: TimeScale | None = None,
             t0: int = 0) -> tuple[list[float], float, float]:  # fmt: skip
    """(grid row heights, legend height, figure height) in inches, for lanes of ``rows`` rows."""
    heights: list[float] = []
    for i, n in enumerate(rows):
        # a spacer row above every rank but the first keeps the zoom's axis label off the next lane
        heights += [RANK_GAP_IN if i else 0.01, max(n, 1) * LANE_ROW_IN + 0.08, MAIN_H_IN]
    legend_in = _legend_in(_legend_rows(ranks, scale, t0)) + footnote_in
    return heights, legend_in, sum(heights) + legend_in + TITLE_IN + 0.45 * len(ranks)


def _figure(plt, ranks: list[RankTimeline], footnote_in: float = 0.0, scale: TimeScale | None = None, t0: int = 0):
    """The figure and its grid: per rank a spacer, a phase lane over the main plot (left) and the zoom (right).
    The lanes' heights are set by :func:`_fit_heights` once their labels are laid out."""
    heights, legend_in, fig_h = _heights(ranks, [1] * len(ranks), footnote_in, scale, t0)
    fig = plt.figure(figsize=(WIDTH_IN, fig_h), dpi=DPI)
    gs = fig.add_gridspec(
        3 * len(ranks),
        2,
        width_ratios=[3.4, 1],
        height_ratios=heights,
        left=0.06,
        right=0.95,
        top=1 - TITLE_IN / fig_h,
        bottom=legend_in / fig_h,
        hspace=0.12,
        wspace=0.34,  # room for the target/capacity labels right of the main plot
    )
    return fig, gs


def _fit_heights(fig, gs, ranks, lanes: list[list[PhaseLabel]], footnote_in: float, scale: TimeScale,
                 t0: int) -> None:  # fmt: skip
    """Give each lane the rows its labels need (before any axes exist: the widths stay as laid out)."""
    heights, legend_in, fig_h = _heights(ranks, [lane_rows(r, lab) for r, lab in zip(ranks, lanes, strict=True)],
                                         footnote_in, scale, t0)  # fmt: skip
    fig.set_figheight(fig_h)
    gs.set_height_ratios(heights)
    gs.update(top=1 - TITLE_IN / fig_h, bottom=legend_in / fig_h)


def _legend(fig, handles: dict, rows: int = LEGEND_ROWS, lift_in: float = 0.0) -> list[str]:
    """One legend for all ranks, below the plots, in a fixed order."""
    order = [*CATEGORIES, "vmm_kv", "non_torch_cupti", "non_torch_unexplained", "non_torch", "others", "reserved"]
    order += ["device_used", "device_used_all", "target", "capacity", "what-if", "oom", "zoom", "break", "gap"]
    items = [handles[k] for k in order if k in handles]
    fig.legend(
        [h for h, _ in items],
        [label for _, label in items],
        loc="lower center",
        ncol=-(-len(items) // rows),
        frameon=False,
        fontsize=FONT - 1,
        bbox_to_anchor=(0.5, 0.005 + lift_in / fig.get_figheight()),
    )
    return [label for _, label in items]


def _fit_title(title: str, width_in: float, size_pt: float) -> str:
    """``title`` on at most two lines that fit the figure's width (a run that died says so before what ran:
    the title grows, and is broken after the verdict, never cut at the edge)."""
    import textwrap

    chars = max(int(0.9 * width_in * 72 / (0.62 * size_pt)), 40)  # bold sans: about 0.62 em a character
    if len(title) <= chars:
        return title
    head, sep, rest = title.partition(" — ")
    if sep and len(head) <= chars:
        return head + " —\n" + textwrap.shorten(rest, chars, placeholder=" …")
    return "\n".join(textwrap.wrap(title, chars)[:2])


def render(
    run, out: str | os.PathLike, *, capacities: list[int] | tuple[int, ...] = (), title: str | None = None
) -> TimelineDrawn:
    """The timeline of an analysed run (``analysis.run.AnalysedRun``): every rank on the run's one time
    origin, stated under the figure; the title from what the run recorded (``analysis.titles``). Returns what
    it drew."""
    from memtrace.analysis.analysed.titles import timeline_title
    from memtrace.plots.timeline_data import prepare_rank

    return render_timeline(
        [prepare_rank(r) for r in run.ranks],
        out,
        capacities=capacities,
        title=title or timeline_title(run),
        t0_us=run.origin.t0_us,
        footnote=f"Times: {run.origin.sentence}",
    )
