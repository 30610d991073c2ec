"""Convert a PyTorch memory snapshot pickle into memtrace trace files.

Reads the pickle written by torch.cuda.memory._dump_snapshot() (with the history recorded by
_record_memory_history) and writes the same events, stacks, segments and record_function phases
to .memtrace files, which later commands read without unpickling anything. A snapshot of one
device becomes one file (SNAPSHOT.memtrace); a snapshot with history on several devices becomes a
run folder (SNAPSHOT/) holding one file per device (cuda0.memtrace, ...), each with rank = the
device index, unless --device picks one.

  memtrace import snap.pickle
  memtrace import snap.pickle --device 1 -o cuda1.memtrace
"""

from __future__ import annotations

import argparse
import sys

NAME = "import"
ORDER = 60


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ._runs import add_output

    parser.add_argument("snapshot", metavar="SNAPSHOT.pickle", help="a torch.cuda.memory._dump_snapshot() file")
    add_output(
        parser,
        "output .memtrace file, or folder for several devices (default: here)",
        metavar="OUT",
        force="replace the output if it exists",
    )
    parser.add_argument("--device", type=int, metavar="N", help="import this device only (default: every device)")
    parser.add_argument("--allow-pickle", action="store_true", help="accepted for symmetry: import always unpickles")


def run(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..importers.files import check_not_a_trace, traces_from_snapshot_file, warn_pickle
    from ..outputs import atomic_write, make_dir, output_dir, output_file
    from ..store import SUFFIX, save_trace

    src = args.snapshot
    if args.device is not None and args.device < 0:
        raise UsageError(f"--device {args.device}: devices are 0 or more")
    check_not_a_trace(src)  # a missing file, or a trace, is one line before anything is unpickled
    several_out = args.output is not None and not str(args.output).lower().endswith(SUFFIX)
    if args.output is None or not several_out:  # check the file name before the long read
        output_file(src, args.output, default_suffix=SUFFIX, suffixes=(SUFFIX,), force=args.force)
    traces = traces_from_snapshot_file(src, device=args.device)
    warn_pickle(src)
    if len(traces) == 1 and not several_out:
        out = output_file(src, args.output, default_suffix=SUFFIX, suffixes=(SUFFIX,), force=args.force)
        with atomic_write(out) as tmp:
            save_trace(traces[0], tmp, overwrite=True)
        written = [out]
    else:
        if args.output is not None and not several_out:
            devs = ", ".join(str(t.process.device_index) for t in traces)
            raise UsageError(
                f"{src} holds history on devices {devs}: pass --device N for one file, or -o a folder for all"
            )
        files = tuple(f"cuda{t.process.device_index}{SUFFIX}" for t in traces)
        folder = output_dir(src, args.output, default_suffix="", files=files, force=args.force)
        make_dir(folder)
        written = []
        for trace, name in zip(traces, files, strict=True):
            with atomic_write(folder / name) as tmp:
                save_trace(trace, tmp, overwrite=True)
            written.append(folder / name)
    for out, t in zip(written, traces, strict=True):
        print(
            f"memtrace: wrote {out}: cuda:{t.process.device_index}, {len(t.events):,} events, {len(t.stacks):,} "
            f"stacks ({t.recording.stacks}), {len(t.phases)} phases, {len(t.segments)} segments",
            file=sys.stderr,
        )
    return 0
