"""Compare two runs and fail (exit 1) when memory grew past a threshold: a regression gate.

Prints the headline first (vLLM's available KV cache and the memory in use before KV sizing, old →
new), then every phase's peak side by side, what grew by category and by allocating stack at each
run's peak, and FlashInfer workspace bytes per hook call.

Exit status: 1 when a global peak (reserved, allocated, NVML device-used), any phase's peak, the
memory before KV sizing, the post-KV transient or a hooked function's bytes grew by more than
--fail-over (or the new run died of OOM where the base did not); 0 otherwise; 2 on bad input.
Phases are matched by path (a phase repeated under one path by occurrence: name#2). Runs that differ
in model, GPU, versions or memory flags are compared with a WARNING naming what differs.

  memtrace diff base-run/ new-run/ --fail-over 2%
  memtrace diff base-run/ new-run/ --fail-over 512MiB --json
"""

from __future__ import annotations

import argparse
import sys

NAME = "diff"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from memtrace.cli._runs import add_input, add_rank

    add_input(p, "base", help="the reference run (directory, .memtrace file or snapshot pickle)")
    add_input(p, "new", help="the run to check")
    p.add_argument(
        "--fail-over",
        default="2%",
        metavar="LIMIT",
        help="allowed growth: a share of the base value (2%%) or a size (512MiB); default 2%%",
    )
    add_rank(p, "compare only this rank (default: every rank)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")


def run(args: argparse.Namespace) -> int:
    from memtrace.analysis.gate.diff import RANK_NEEDS, compared
    from memtrace.cli._runs import analysed_together
    from memtrace.plots.render import render
    from memtrace.units import parse_threshold

    threshold = parse_threshold(args.fail_over)
    base, new = analysed_together(args, ("base", "new"), RANK_NEEDS)
    failed = any(d.failed for d in compared(base, new, threshold))
    render(new, sys.stdout, "diff", base=base, threshold=threshold, json_out=args.json)
    return 1 if failed else 0
