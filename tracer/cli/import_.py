"""Convert a PyTorch memory snapshot pickle, or a torch.profiler trace, into memtrace trace files.

Reads the pickle written by torch.cuda.memory._dump_snapshot() and writes the same events, stacks,
segments and record_function phases to .memtrace files, which later commands read without
unpickling anything. A snapshot dumped without _record_memory_history is the allocator's state at
one moment: it becomes a trace of that moment (no timeline). A torch.profiler trace
(.pt.trace.json[.gz], profile_memory=True; vLLM's --profiler-config writes one per worker) gives its
[memory] events, with the profiler's operators as stacks. A file of one device becomes one file
(FILE.memtrace); one with several devices, or with host memory (pinned host memory of a torch 2.14
snapshot, the CPU's events of a profiler trace), becomes a run folder (FILE/) holding one file per
device (cuda0.memtrace, ..., host.memtrace), each CUDA device with rank = its index, unless --device
picks one.

  memtrace import snap.pickle
  memtrace import snap.pickle --device 1 -o cuda1.memtrace
  memtrace import worker.rank0.1733312000.pt.trace.json.gz
"""

from __future__ import annotations

import argparse
import sys

NAME = "import"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from memtrace.cli._runs import add_output

    parser.add_argument(
        "snapshot",
        metavar="SNAPSHOT.pickle|TRACE.json",
        help="a torch.cuda.memory._dump_snapshot() file or a torch.profiler trace (.json, .json.gz)",
    )
    add_output(
        parser,
        "output .memtrace file, or folder for several devices (default: here)",
        metavar="OUT",
        force="replace the output if it exists",
    )
    parser.add_argument("--device", type=int, metavar="N", help="import this device only (default: every device)")
    parser.add_argument("--allow-pickle", action="store_true", help="accepted for symmetry: import always unpickles")


def run(args: argparse.Namespace) -> int:
    from memtrace.errors import UsageError
    from memtrace.importers.files import check_not_a_trace, is_profiler_path, traces_from_snapshot_file, warn_pickle
    from memtrace.importers.kineto import traces_from_kineto_file
    from memtrace.outputs import atomic_write, make_dir, output_dir, output_file
    from memtrace.store import SUFFIX, save_trace

    src = args.snapshot
    if args.device is not None and args.device < 0:
        raise UsageError(f"--device {args.device}: devices are 0 or more")
    if not is_profiler_path(src):
        check_not_a_trace(src)  # a missing file, or a trace, is one line before anything is unpickled
    several_out = args.output is not None and not str(args.output).lower().endswith(SUFFIX)
    # check the output before the long read (and before unpickling warns): an input, an unwritable place
    if args.output is None or not several_out:
        output_file(src, args.output, default_suffix=SUFFIX, suffixes=(SUFFIX,), force=args.force)
    else:
        output_dir(src, args.output, default_suffix="", files=(), force=args.force)
    if is_profiler_path(src):
        traces = traces_from_kineto_file(src, device=args.device)
    else:
        traces = traces_from_snapshot_file(src, device=args.device)
        warn_pickle(src)
    if len(traces) == 1 and not several_out:
        out = output_file(src, args.output, default_suffix=SUFFIX, suffixes=(SUFFIX,), force=args.force)
        with atomic_write(out) as tmp:
            save_trace(traces[0], tmp, overwrite=True)
        written = [out]
    else:
        if args.output is not None and not several_out:
            raise UsageError(f"{src} holds {_what(traces)}: pass --device N for one file, or -o a folder for all")
        files = tuple(f"{_name(t)}{SUFFIX}" for t in traces)
        folder = output_dir(src, args.output, default_suffix="", files=files, force=args.force)
        make_dir(folder)
        written = []
        for trace, name in zip(traces, files, strict=True):
            with atomic_write(folder / name) as tmp:
                save_trace(trace, tmp, overwrite=True)
            written.append(folder / name)
    for out, t in zip(written, traces, strict=True):
        print(
            f"memtrace: wrote {out}: {_where(t)}, {len(t.events):,} events, {len(t.stacks):,} "
            f"stacks ({t.recording.stacks}), {len(t.phases)} phases, {len(t.segments)} segments",
            file=sys.stderr,
        )
    return 0


def _name(t) -> str:
    """A trace's file name in the run folder: ``cuda1``, ``pinned-host``, ``host``."""
    return f"cuda{t.process.device_index}" if t.process.device_index is not None else t.process.role


def _where(t) -> str:
    return f"cuda:{t.process.device_index}" if t.process.device_index is not None else t.label


def _what(traces) -> str:
    """``cuda:0 (allocator state only), cuda:1 (history), pinned host``: what each trace holds."""
    from memtrace import facts as F

    parts = []
    for t in traces:
        state = (t.facts.get(F.IMPORT) or {}).get("state")
        kind = {"moment": " (allocator state only)", "totals": " (profiler memory events)"}.get(state, " (history)")
        parts.append(_where(t) + (kind if t.process.device_index is not None else ""))
    return ", ".join(parts)
