"""Would this start-up survive on a card of another size? If not, in which phase, and by how much.

The model keeps what does not depend on the card (weights, workspaces, profile_run's activations,
CUDA context and other non-PyTorch memory, unless --non-torch gives the other card's), counts only
the segments PyTorch could not release (a full card's allocator frees its cached segments before it
fails), sizes the KV cache as vLLM does
(util × capacity − non-KV memory) and moves the post-KV part of the recorded curve by the change
in KV bytes. A start-up dies where the curve goes over the physical capacity: in profiling
(before the KV cache, where --gpu-memory-utilization cannot help), at KV sizing (no memory left
for the cache blocks), or in warm-up / CUDA-graph capture (the post-KV transient).

A recording that ended in a CUDA OOM covers the start-up only up to that failed request: on its own
card (or one with no more room) the answer is that it dies there (the phase, the request, the free
memory); on a larger card, "unknown" when the request would fit (what came after it was never
recorded). Such a recording never answers "fits".

  memtrace fits RUN --capacity 32GiB
  memtrace fits RUN --capacity 16GiB,24GiB,32GiB --util 0.92

Exit status: 0 when it fits on every capacity asked, 1 when it dies on one (or the recording ends
too early to tell), 2 on bad input (a capacity below 1GiB included).
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "fits"
ORDER = 45


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ._runs import add_input

    add_input(p)
    p.add_argument(
        "--capacity",
        required=True,
        metavar="SIZE[,SIZE...]",
        help="card memory: 32GiB, 24GB, or several separated by commas for a table (at least 1GiB)",
    )
    p.add_argument(
        "--util",
        default=None,
        metavar="FRACTION",
        help="--gpu-memory-utilization on that card (default: the recorded one, else 0.9)",
    )
    p.add_argument(
        "--non-torch",
        default=None,
        metavar="SIZE",
        help="non-PyTorch memory on that card (CUDA context, NCCL, libraries); default: as recorded (NVML)",
    )
    p.add_argument(
        "--rank",
        type=int,
        default=None,
        help="only this rank (default: every rank with allocator events, and the worst named)",
    )
    p.add_argument("--json", action="store_true", help="print the predictions as JSON")


def run(args: argparse.Namespace) -> int:
    from ..analysis.fits import check_capacity, fit_to_dict, fits, recorded, smallest_fitting, worst_rank
    from ..plots.fits_text import render_fits
    from ..progress import task
    from ..units import format_gib as _gib
    from ..units import parse_fraction, parse_size, parse_sizes
    from ._runs import load_args, select

    capacities = [check_capacity(c) for c in parse_sizes(args.capacity)]
    util = parse_fraction(args.util) if args.util is not None else None
    non_torch = parse_size(args.non_torch) if args.non_torch is not None else None
    run = load_args(args)
    traces = [t for t in select(run, args.rank) if len(t.events)] or select(run, args.rank)[:1]
    answers = []  # (trace, results, smallest), one per rank
    for trace in traces:
        with task("Predicting", total=None):
            rec = recorded(trace, non_torch)
            results = fits(trace, capacities, util, rec=rec)
            smallest = smallest_fitting(trace, util, rec=rec)
        answers.append((trace, results, smallest))
    multi = len(answers) > 1
    worst = answers[worst_rank([a[2] for a in answers])]
    if args.json:
        out = {
            "run": args.run_path,
            "worst": worst[0].label if multi else None,
            "ranks": [
                {
                    "rank": trace.process.rank,
                    "pid": trace.process.pid,
                    "smallest_fitting_capacity_bytes": smallest,
                    "fits": [fit_to_dict(r) for r in results],
                }
                for trace, results, smallest in answers
            ],
        }
        if not multi:  # one process: the flat shape
            out.update(out.pop("ranks")[0])
            out.pop("rank"), out.pop("pid"), out.pop("worst")
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        for trace, results, smallest in answers:
            sys.stdout.write(
                render_fits(results, f"{args.run_path} ({trace.label})" if multi else args.run_path, smallest)
            )
        if multi:
            need = f"needs about {_gib(worst[2])}" if worst[2] is not None else "fits on no card tried"
            sys.stdout.write(
                f"Worst rank: {worst[0].label} ({need}); every rank must fit for the start-up to survive\n"
            )
    return 0 if all(r.survives for _, results, _ in answers for r in results) else 1
