"""Convert a PyTorch memory snapshot pickle into a memtrace trace file.

Reads the pickle written by torch.cuda.memory._dump_snapshot() (with the history recorded by
_record_memory_history) and writes the same events, stacks, segments and record_function phases
to a .memtrace file, which later commands read without unpickling anything.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

NAME = "import"
ORDER = 60


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("snapshot", metavar="SNAPSHOT.pickle", help="a torch.cuda.memory._dump_snapshot() file")
    parser.add_argument("-o", "--output", metavar="OUT.memtrace", help="output file (default: SNAPSHOT.memtrace)")
    parser.add_argument("--device", type=int, metavar="N", help="device to import (default: the busiest)")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite the output if it exists")


def run(args: argparse.Namespace) -> int:
    from ..errors import TraceFormatError
    from ..importers.files import trace_from_snapshot_file, warn_pickle
    from ..store import SUFFIX, save_trace

    src = Path(args.snapshot)
    out = Path(args.output) if args.output else src.with_suffix(SUFFIX)
    if out.exists() and not args.force:
        raise TraceFormatError(f"{out} already exists; choose another output with -o or pass --force")
    if out.resolve() == src.resolve():
        raise TraceFormatError(f"the output {out} is the snapshot itself; choose another output with -o")
    warn_pickle(src)
    trace = trace_from_snapshot_file(src, device=args.device)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        save_trace(trace, tmp, overwrite=True)
        os.replace(tmp, out)  # the old output (with --force) is replaced only by a complete new one
    finally:
        tmp.unlink(missing_ok=True)
    print(
        f"memtrace: wrote {out}: {len(trace.events):,} events, {len(trace.stacks):,} stacks, "
        f"{len(trace.phases)} phases, {len(trace.segments)} segments",
        file=sys.stderr,
    )
    return 0
