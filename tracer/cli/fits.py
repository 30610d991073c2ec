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
import sys

NAME = "fits"
ORDER = 45


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ._runs import add_input, add_rank

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
    add_rank(p, "only this rank (default: every rank with allocator events, and the worst named)")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON")


def run(args: argparse.Namespace) -> int:
    from ..analysis.fits import check_capacity, check_non_torch
    from ..plots.render import render
    from ..progress import task
    from ..units import parse_fraction, parse_size, parse_sizes
    from ._runs import analysed

    capacities = [check_capacity(c) for c in parse_sizes(args.capacity)]
    util = parse_fraction(args.util) if args.util is not None else None
    non_torch = check_non_torch(parse_size(args.non_torch) if args.non_torch is not None else None, capacities)
    run_ = analysed(args)
    with task("Predicting", total=None):
        ranks = run_.require_events("predict")
        survives = all(r.fits(capacities, util, non_torch).survives for r in ranks)
    render(run_, sys.stdout, "fits", capacities=capacities, util=util, non_torch=non_torch, json_out=args.json)
    return 0 if survives else 1
