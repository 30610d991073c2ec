"""Draw the start-up timeline: memory by category, the target, the first crossing and the OOM.

The image shows PyTorch allocated memory stacked by category (weights, KV cache, FlashInfer
workspace, CUDA-graph pools, activations), the reserved and NVML device-used lines with the
non-PyTorch memory between them, the phases, the --gpu-memory-utilization target and the card's
capacity, the first crossing of the target (its moment, and the excursion's maximum) and the OOM
the run died of (the failed request and the free memory; the time after it greyed out), annotated
and zoomed. One panel per rank. The title names the model, vLLM version and GPU the trace recorded.

  memtrace plot RUN                       # writes <run>-timeline.png
  memtrace plot RUN -o timeline.svg --capacity 16GiB,32GiB
  memtrace plot RUN --util 0.85           # another target: 0.85 x the card the run stood for
"""

from __future__ import annotations

import argparse
import sys

NAME = "plot"
ORDER = 30
FORMATS = (".png", ".svg", ".pdf")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ._runs import add_input, add_target

    add_input(p)
    p.add_argument(
        "-o", "--output", metavar="FILE", help="image to write, .png, .svg or .pdf (default: <run>-timeline.png)"
    )
    add_target(p)
    p.add_argument("--capacity", metavar="SIZE[,SIZE...]", help="what-if card sizes to draw, e.g. 16GiB,32GiB")
    p.add_argument("--rank", type=int, default=None, help="draw only this rank (default: every rank)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists (never an input)")


def with_events(traces: list, run_path: str, what: str) -> list:
    """The traces that recorded allocator events; the others are skipped with a note on stderr.

    Raises UsageError when none did (a CPU-only worker, or recording never started).
    """
    from ..errors import UsageError

    kept = [t for t in traces if len(t.events)]
    if not kept:
        names = ", ".join(t.label for t in traces)
        raise UsageError(
            f"{run_path}: {names} recorded no allocator events, so there is nothing to {what} "
            "(a CPU-only worker, or recording never started)"
        )
    for t in traces:
        if not len(t.events):
            print(f"memtrace: skipping {t.label}: no allocator events", file=sys.stderr)
    return kept


def run(args: argparse.Namespace) -> int:
    from ..analysis.target import resolve_target
    from ..outputs import atomic_write, output_file, run_name
    from ..plots.timeline import render_timeline
    from ..plots.timeline_data import prepare_rank
    from ..plots.titles import timeline_title
    from ..progress import task
    from ..units import format_gib, parse_sizes
    from ._runs import load_args, select, target_args

    kwargs = target_args(args)
    capacities = parse_sizes(args.capacity) if args.capacity else []
    out = output_file(args.run_path, args.output, default_suffix="-timeline.png", suffixes=FORMATS, force=args.force)
    traces = with_events(select(load_args(args), args.rank), args.run_path, "draw")
    targets = [resolve_target(t, **kwargs) for t in traces]
    with task(f"Drawing {out}", total=None), atomic_write(out) as tmp:
        ranks = [prepare_rank(t, target=tg) for t, tg in zip(traces, targets, strict=True)]
        title = timeline_title(traces[0], fallback=run_name(args.run_path))
        drawn = render_timeline(ranks, tmp, capacities=capacities, title=title)
    for r in drawn.ranks:
        c, o = r.crossing, r.oom
        if c is not None:
            print(
                f"memtrace: {r.label}: {'NVML device used' if c.curve == 'device_used' else 'PyTorch reserved'} "
                f"crossed {format_gib(r.target_bytes)} at {c.time_s:.3f} s in {c.phase_path or 'no phase'}; "
                f"highest {format_gib(c.max_bytes)} (+{format_gib(c.overshoot_bytes)})",
                file=sys.stderr,
            )
        if o is not None:
            print(f"memtrace: {r.label}: {o.text.replace(chr(10), '; ')}", file=sys.stderr)
    print(f"memtrace: wrote {out}", file=sys.stderr)
    return 0
