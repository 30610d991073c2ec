"""Draw the start-up timeline: memory by category, the target, and the moment it was crossed.

The image shows PyTorch allocated memory stacked by category (weights, KV cache, FlashInfer
workspace, CUDA-graph pools, activations), the reserved and NVML device-used lines with the
non-PyTorch memory between them, the phases, the --gpu-memory-utilization target and the card's
capacity, and the first crossing of the target, annotated and zoomed. One panel per rank.

  memtrace plot RUN                       # writes <run>-timeline.png
  memtrace plot RUN -o timeline.svg --capacity 16GiB,32GiB
  memtrace plot RUN --util 0.85           # draw another target (default: the recorded one)
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

NAME = "plot"
ORDER = 30
FORMATS = (".png", ".svg", ".pdf")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_path", metavar="RUN", help="run directory or .memtrace file")
    p.add_argument("-o", "--output", metavar="FILE", help="image to write, .png or .svg (default: <run>-timeline.png)")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--target", metavar="BYTES", help="the line not to cross, e.g. 88GiB (default: recorded)")
    target.add_argument("--util", metavar="FRACTION", help="target as a share of the card, e.g. 0.92 or 92%%")
    p.add_argument("--capacity", metavar="SIZE[,SIZE...]", help="what-if card sizes to draw, e.g. 16GiB,32GiB")
    p.add_argument("--rank", type=int, default=None, help="draw only this rank (default: every rank)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")


def output_path(run_path: str, output: str | None, force: bool, suffix: str) -> Path:
    """The file to write: ``output``, else ``<run name><suffix>`` in the current directory.

    Raises UsageError when it exists and ``force`` is false.
    """
    from ..errors import UsageError

    if output:
        out = Path(output)
    else:
        name = Path(run_path.rstrip("/")).name.removesuffix(".memtrace")
        out = Path(f"{name}{suffix}")
    if out.exists() and not force:
        raise UsageError(f"{out} exists; pass --force to replace it or -o to choose another file")
    if out.parent and not out.parent.exists():
        raise UsageError(f"cannot write {out}: folder {out.parent} does not exist")
    return out


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


def _target_for(trace, target: int | None, util: float | None) -> int | None:
    from ..errors import UsageError

    if util is None:
        return target
    from ..plots.timeline_data import card_capacity

    total = card_capacity(trace)
    if not total:
        raise UsageError(f"{trace.label} did not record the device's capacity; give --target BYTES instead of --util")
    return math.ceil(util * total)


def run(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..units import format_gib, parse_fraction, parse_size, parse_sizes
    from ._runs import load_with_progress, select

    target = parse_size(args.target) if args.target is not None else None
    util = parse_fraction(args.util) if args.util is not None else None
    capacities = parse_sizes(args.capacity) if args.capacity else []
    if args.output and Path(args.output).suffix.lower() not in FORMATS:
        raise UsageError(f"cannot draw {Path(args.output).name}: the output must end in {', '.join(FORMATS)}")
    traces = with_events(select(load_with_progress(args.run_path), args.rank), args.run_path, "draw")
    out = output_path(args.run_path, args.output, args.force, "-timeline.png")
    from ..plots.timeline import render_timeline
    from ..plots.timeline_data import prepare_rank
    from ..progress import task

    with task(f"Drawing {out}", total=None):
        ranks = [prepare_rank(t, _target_for(t, target, util)) for t in traces]
        name = Path(args.run_path.rstrip("/")).name
        drawn = render_timeline(ranks, out, capacities=capacities, title=f"GPU memory during start-up: {name}")
    for r in drawn.ranks:
        c = r.crossing
        if c is not None:
            where = c.phase_path or "no phase"
            print(
                f"memtrace: {r.label}: crossed {format_gib(r.target_bytes or 0)} at {c.time_s:.3f} s in {where}, "
                f"peak {format_gib(c.value_bytes)} (+{format_gib(c.overshoot_bytes)})",
                file=sys.stderr,
            )
    print(f"memtrace: wrote {out}", file=sys.stderr)
    return 0
