"""Ask every running worker of a serving run to write its serving window now (SIGUSR2), and wait for it.

RUN is the run directory of `memtrace run --until serving` (or MEMTRACE_UNTIL=serving). Each worker on this host
that still runs is signalled only when it is the process that wrote its trace (a reused pid is left alone) and
catches SIGUSR2, as a worker in serving mode does (SIGUSR2 would kill any other process); the server keeps serving.
Then `memtrace report RUN` shows the windows. Do this before stopping a server with SIGTERM, which kills its
workers before they can write (docs/serving.md). Exit 0: every running worker wrote a new window; 1: some did not
in time, or none was running; 2: RUN holds no trace recorded in serving mode.
"""

from __future__ import annotations

import argparse
import sys

NAME = "window"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_path", metavar="RUN", help="the run directory of a serving run")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds to wait for each window (60)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memtrace.capture.ask_window import ask
    from memtrace.errors import UsageError
    from memtrace.store import trace_files

    if not args.timeout > 0:
        raise UsageError(f"--timeout {args.timeout:g}: give the seconds to wait, more than 0")
    if not Path("/proc/self/status").exists():
        raise UsageError("memtrace window reads /proc to check a worker before signalling it: run it on the Linux host")
    run_dir = Path(args.run_path)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a run directory: give the --dir of `memtrace run --until serving`")
    files = trace_files(run_dir)
    if not files:
        raise UsageError(f"{run_dir} holds no trace file: was the server started with `memtrace run --until serving`?")
    asked = [ask(f, args.timeout) for f in files]
    for a in asked:
        print(f"memtrace: {a.path.name}: {a.line}", file=sys.stderr)
    if not any(a.serving for a in asked):
        raise UsageError(f"no trace in {run_dir} was recorded in serving mode: start it with --until serving")
    return 0 if any(a.outcome == "written" for a in asked) and all(a.outcome != "late" for a in asked) else 1
