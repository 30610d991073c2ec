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


def add_arguments(p: argparse.ArgumentParser) -> None:
    from memtrace.cli._runs import add_input, add_output, add_rank, add_target

    add_input(p)
    add_output(p, "image to write, .png, .svg or .pdf (default: <run>-timeline.png)")
    add_target(p)
    p.add_argument(
        "--capacity",
        metavar="SIZE[,SIZE...]",
        help="card sizes to draw as lines, e.g. 16GiB,32GiB (whether each boots is memtrace fits's answer)",
    )
    add_rank(p, "draw only this rank (default: every rank)")


def run(args: argparse.Namespace) -> int:
    from memtrace.cli._runs import analysed, events_only
    from memtrace.outputs import atomic_write, output_file
    from memtrace.plots.render import FORMATS, render
    from memtrace.progress import task
    from memtrace.units import parse_sizes

    capacities = parse_sizes(args.capacity) if args.capacity else []
    image = FORMATS["timeline"]
    out = output_file(
        args.run_path, args.output, default_suffix=image.suffix, suffixes=image.suffixes, force=args.force
    )
    run_ = events_only(analysed(args), "draw")
    with task(f"Drawing {out}", total=None), atomic_write(out) as tmp:
        render(run_, tmp, "timeline", capacities=capacities)
    render(run_, sys.stderr, "lines")
    print(f"memtrace: wrote {out}", file=sys.stderr)
    return 0
