"""Summarize a run: per-phase table, peak, crossing of the target, top holders, hook calls.

RUN_OR_FILE is a run directory, a .memtrace file, or a PyTorch snapshot pickle (.pickle/.pkl, or any
name with --allow-pickle). The target is --target, or --util x --total (or x the device's capacity),
or what the trace recorded (vLLM's --gpu-memory-utilization). Sizes print in GiB; --json prints the
exact integers of bytes and microseconds.
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "report"
ORDER = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="RUN_OR_FILE", help="run directory, .memtrace file or snapshot pickle")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--target", metavar="BYTES", help="the line not to cross, e.g. 88GiB or 94489280512")
    target.add_argument("--util", metavar="FRACTION", help="utilization target, e.g. 0.92 (times --total)")
    parser.add_argument("--total", metavar="BYTES", help="device capacity for --util (default: the trace's)")
    parser.add_argument("--rank", type=int, metavar="N", help="only this rank (default: every rank)")
    parser.add_argument("--top", type=int, default=10, metavar="N", help="holders to list at the peak (10)")
    parser.add_argument("--json", action="store_true", help="exact integers as JSON instead of text")
    parser.add_argument("--markdown", action="store_true", help="GitHub markdown (for an upstream issue)")
    parser.add_argument("--width", type=int, default=100, help="text width (100)")
    parser.add_argument("--allow-pickle", action="store_true", help="read RUN_OR_FILE as a snapshot pickle")


def _target_for(args: argparse.Namespace, trace) -> int | None:
    import math

    from ..errors import UsageError
    from ..units import parse_fraction, parse_size

    if args.target is not None:
        return parse_size(args.target)
    if args.util is None:
        if args.total is not None:
            raise UsageError("--total only applies with --util; pass --util 0.92 --total 96GB, or --target BYTES")
        return None
    util = parse_fraction(args.util)
    total = parse_size(args.total) if args.total is not None else trace.process.device_total_bytes
    if not total:
        raise UsageError(f"{trace.label} does not record its device capacity; pass --total BYTES with --util")
    return math.ceil(util * total)


def run(args: argparse.Namespace) -> int:
    from ..analysis.summary import summarize, summary_to_dict, worst
    from ..importers.files import load_input
    from ..plots.text import render_run
    from ._runs import select

    run_ = load_input(args.path, allow_pickle=args.allow_pickle)
    traces = select(run_, args.rank)
    summaries = [summarize(t, _target_for(args, t), top=args.top) for t in traces]
    if args.json:
        w = worst(summaries)
        doc = {
            "path": run_.path,
            "worst": w.label if w is not None and len(summaries) > 1 else None,
            "traces": [summary_to_dict(s) for s in summaries],
        }
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    render_run(summaries, sys.stdout, width=args.width, markdown=args.markdown)
    return 0
