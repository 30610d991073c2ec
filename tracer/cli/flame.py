"""Draw what held GPU memory at one moment: a flame graph of the live allocations by stack.

The widest frames are the code that allocated the memory live at that moment; FlashInfer's
workspace allocators appear as frames of their own ("[hook] allocate_sm120_dynamic_workspace").
--at picks the moment: "peak" (the peak of reserved memory, with the allocation that caused it),
a number of seconds since the start, or a phase (its name or path: the moment of its highest
allocated memory). The SVG needs no network; --format folded writes "frame;frame bytes" lines for
speedscope or flamegraph.pl, which add up to the live bytes exactly.

  memtrace flame RUN                         # writes <run>-flame.svg at the peak
  memtrace flame RUN --at profile_run --format folded -o profile.folded
  memtrace flame RUN --at 18.25 --rank 1
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

NAME = "flame"
ORDER = 31
SUFFIX = {"svg": "-flame.svg", "folded": "-flame.folded"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_path", metavar="RUN", help="run directory or .memtrace file")
    p.add_argument("--at", default="peak", metavar="peak|SECONDS|PHASE", help="the moment to show (default: peak)")
    p.add_argument("-o", "--output", metavar="FILE", help="file to write (default: <run>-flame.svg or .folded)")
    p.add_argument("-f", "--format", choices=sorted(SUFFIX), default=None, help="svg (default) or folded")
    p.add_argument("--rank", type=int, default=None, help="the rank to show (default: the one with the highest peak)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")


@dataclass(frozen=True)
class Moment:
    """The moment a flame graph shows: the state right after ``event_index``, or at ``time_us``."""

    time_us: int
    event_index: int | None
    what: str  # "the peak", "18.250 s", "the fullest moment of profile_run"
    phase_path: str


def resolve_moment(trace, curves, at: str) -> Moment:
    """Read --at for ``trace``: "peak", seconds since the start, or a phase name/path; UsageError otherwise."""
    from ..analysis.flame import peak_event_index, window_peak_event_index
    from ..analysis.phases import path_at, phase_path, phase_stats, recording_span
    from ..errors import UsageError

    start, end = recording_span(trace)
    ev_time = trace.events["time_us"]

    def at_event(k: int, what: str) -> Moment:
        t = int(ev_time[k]) if k >= 0 else start
        return Moment(t, k, what, path_at(trace, t))

    text = at.strip()
    if text.lower() == "peak":
        return at_event(peak_event_index(curves.allocated, curves.reserved), "the peak")
    try:
        seconds = float(text.removesuffix("s"))
        seconds = seconds if math.isfinite(seconds) else None
    except ValueError:
        seconds = None
    if seconds is not None:
        t = start + round(seconds * 1e6)
        if not start <= t <= end:
            raise UsageError(f"--at {at}: the run lasts {(end - start) / 1e6:.3f} s; give seconds from 0 to that")
        return Moment(t, None, f"{seconds:.3f} s", path_at(trace, t))
    matches = [s for s in phase_stats(trace, curves) if text in (s.name, s.path)]
    if not matches:
        names = sorted({phase_path(trace, i) for i in range(len(trace.phases))})
        known = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "") if names else "none recorded"
        raise UsageError(f"--at {at}: no such phase; use peak, seconds, or one of: {known}")
    best = max(matches, key=lambda s: (s.peak_allocated_bytes, -s.start_us))
    k = window_peak_event_index(curves.allocated, best.start_us, best.end_us)
    m = at_event(k, f"the fullest moment of {best.path}")
    return Moment(max(m.time_us, best.start_us), k, m.what, best.path)


def _pick_trace(traces, rank):
    if rank is not None or len(traces) == 1:
        return traces[0]
    from ..analysis.curves import reserved_curve

    return max(traces, key=lambda t: reserved_curve(t).peak_bytes)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..analysis.curves import all_curves
    from ..analysis.flame import flame_at
    from ..analysis.summary import resolve_target
    from ..units import format_gib
    from ._runs import load_with_progress, select
    from .plot import output_path, with_events

    fmt = args.format
    if fmt is None:
        fmt = "folded" if args.output and Path(args.output).suffix.lower() in (".folded", ".txt") else "svg"
    traces = with_events(select(load_with_progress(args.run_path), args.rank), args.run_path, "show")
    trace = _pick_trace(traces, args.rank)
    curves = all_curves(trace)
    moment = resolve_moment(trace, curves, args.at)
    out = output_path(args.run_path, args.output, args.force, SUFFIX[fmt])
    flame = flame_at(trace, moment.time_us if moment.event_index is None else None, event_index=moment.event_index)
    if fmt == "folded":
        from ..plots.folded import render_folded

        render_folded(flame, out)
    else:
        from ..analysis.phases import recording_span
        from ..plots.flame_svg import render_flame_svg

        start, _ = recording_span(trace)
        secs = (moment.time_us - start) / 1e6
        k = moment.event_index
        reserved = curves.reserved.bytes[k + 1] if k is not None else curves.reserved.at(moment.time_us)
        target, _ = resolve_target(trace, None)
        sub = [trace.label, f"{format_gib(flame.total_bytes)} allocated", f"reserved {format_gib(int(reserved))}"]
        if target is not None:
            sub.append(f"target {format_gib(target)}")
        if trace.recording.stacks == "none":
            sub.append("no Python stacks recorded: grouped by phase")
        sub.append(Path(args.run_path.rstrip("/")).name)
        render_flame_svg(
            flame,
            out,
            title=f"Live GPU memory at {moment.what}: {secs:.3f} s"
            + ("" if moment.what.endswith(moment.phase_path) else f", in {moment.phase_path or 'no phase'}"),
            subtitle=" · ".join(sub),
        )
    print(f"memtrace: {trace.label}: {format_gib(flame.total_bytes)} live at {moment.what}", file=sys.stderr)
    print(f"memtrace: wrote {out}", file=sys.stderr)
    return 0
