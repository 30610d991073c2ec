"""Summarize a run: per-phase table, peak, crossing of the target, top holders, hook calls, the OOM.

RUN is a run directory, a .memtrace file, or a PyTorch snapshot pickle (.pickle/.pkl, or any name
with --allow-pickle). The target is --target, or --util x --total (or x the card the run stood for),
or what the trace recorded (vLLM's --gpu-memory-utilization). Sizes print in GiB; --json prints the
exact integers of bytes and microseconds. A run that died of CUDA OOM says so in its first lines.
A run of several ranks ends with the ranks side by side, the worst rank, the ranks missing from the
run directory, and the one time origin every time counts from.
"""

from __future__ import annotations

import argparse
import sys

NAME = "report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from memtrace.cli._runs import add_input, add_rank, add_target

    add_input(parser)
    add_target(parser)
    add_rank(parser)
    parser.add_argument("--top", type=int, default=10, metavar="N", help="holders to list at the peak (10)")
    parser.add_argument("--json", action="store_true", help="exact integers as JSON instead of text")
    parser.add_argument(
        "--markdown", action="store_true", help="GitHub markdown (for an upstream issue; not with --json)"
    )
    parser.add_argument("--width", type=int, default=100, help="text width (100)")


def run(args: argparse.Namespace) -> int:
    from memtrace.cli._runs import analysed
    from memtrace.errors import UsageError
    from memtrace.plots.render import render

    if args.json and args.markdown:
        raise UsageError("--json and --markdown are two output formats: give one")
    if args.top < 0:
        raise UsageError(f"--top {args.top}: give how many holders to list, 0 or more")
    if args.width < 40:
        raise UsageError(f"--width {args.width}: give at least 40 columns")
    run_ = analysed(args, top=args.top)
    if args.json:
        render(run_, sys.stdout, "json")
    else:
        render(run_, sys.stdout, "markdown" if args.markdown else "text", width=args.width)
    return 0
