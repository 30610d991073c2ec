"""Write a run in another tool's format: Perfetto/Chrome JSON, a memory_viz snapshot, folded stacks.

  perfetto    trace-event JSON for ui.perfetto.dev / chrome://tracing: counter tracks for the
              allocated, reserved, device-used and non-PyTorch curves (from vLLM 0.34 the KV cache
              committed through CUDA VMM, and apart the VMM address space reserved, which is not
              memory), slices for phases and hook calls, one process track per traced process (every rank)
  memory-viz  a torch.cuda.memory._snapshot()-shaped pickle (protocol 4) for pytorch.org/memory_viz
              (one rank: --rank, default the run's worst rank, as every output names it); a free recorded
              without its free_requested (memtrace skips them) gets one back just before it
  folded      folded stacks of what was live at the peak, for speedscope / flamegraph.pl (the worst rank; with
              CUPTI records, the non-PyTorch allocations under "[non-PyTorch, CUPTI]" too; from vLLM
              0.34, the KV cache committed through CUDA VMM under "[KV cache outside PyTorch (CUDA VMM)]")

The output defaults to RUN's name plus .perfetto.json, .memory_viz.pickle or -flame.folded, here;
the name must end in the format's suffix, its folder must exist, an input is never overwritten (not
even with --force) and an existing file is only replaced with --force, atomically.

  memtrace export RUN --format perfetto
  memtrace export RUN --format memory-viz -o startup.pickle
  memtrace export RUN -f csv                 # the curves: rank,quantity,time_us,bytes (RUN.curves.csv)
"""

from __future__ import annotations

import argparse

NAME = "export"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from memtrace.cli._runs import add_input, add_output, add_rank, add_target

    add_input(p)
    add_target(p)  # perfetto: the target counter and the first crossing
    from memtrace.plots.render import offered_by

    p.add_argument(
        "-f", "--format", choices=sorted(offered_by(NAME)), default="perfetto", help="output format (perfetto)"
    )
    add_output(p, "output file (default: RUN's name + the format's suffix)")
    add_rank(p, "the rank to export (memory-viz, folded; default: the worst rank)")


def run(args: argparse.Namespace) -> int:
    import sys

    from memtrace.cli._runs import analysed, check_rank, events_only
    from memtrace.outputs import atomic_write, output_file
    from memtrace.plots.render import offered_by, render
    from memtrace.progress import task

    check_rank(args.rank)
    fmt = offered_by(NAME)[args.format]
    out = output_file(args.run_path, args.output, default_suffix=fmt.suffix, suffixes=fmt.suffixes, force=args.force)
    run_ = analysed(args)
    if fmt.name == "folded":  # a flame of what was live: nothing to show without allocator events, as flame
        run_ = events_only(run_, "show")
    with task(f"Writing {out}", total=len(run_.ranks)) as t, atomic_write(out) as tmp:
        if fmt.name == "folded":  # a flame at one moment: it says which on stderr
            render(run_, tmp, fmt.name, log=sys.stderr)
        else:
            render(run_, tmp, fmt.name, progress=t)
    print(f"memtrace: wrote {out}", file=sys.stderr)
    return 0
