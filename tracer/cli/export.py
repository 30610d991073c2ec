"""Write a run in another tool's format: Perfetto/Chrome JSON, a memory_viz snapshot, folded stacks.

  perfetto    trace-event JSON for ui.perfetto.dev / chrome://tracing: counter tracks for the
              allocated, reserved, device-used and non-PyTorch curves, slices for phases and hook
              calls, one process track per traced process (every rank)
  memory-viz  a torch.cuda.memory._snapshot()-shaped pickle (protocol 4) for pytorch.org/memory_viz
              (one rank: --rank, default the first)
  folded      folded stacks of what was live at the peak, for speedscope / flamegraph.pl (one rank; with
              CUPTI records, the non-PyTorch allocations under "[non-PyTorch, CUPTI]" too)

The output defaults to RUN's name plus .perfetto.json, .memory_viz.pickle or -flame.folded, here;
the name must end in the format's suffix, its folder must exist, an input is never overwritten (not
even with --force) and an existing file is only replaced with --force, atomically.

  memtrace export RUN --format perfetto
  memtrace export RUN --format memory-viz -o startup.pickle
"""

from __future__ import annotations

import argparse

NAME = "export"
ORDER = 60

#: Default name endings per format (folded matches ``memtrace flame``'s ``<run>-flame.folded``).
SUFFIX = {"perfetto": ".perfetto.json", "memory-viz": ".memory_viz.pickle", "folded": "-flame.folded"}
#: Endings each format accepts for -o.
ACCEPTS = {"perfetto": (".json",), "memory-viz": (".pickle", ".pkl"), "folded": (".folded", ".txt")}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ._runs import add_input, add_target

    add_input(p)
    add_target(p)  # perfetto: the target counter and the first crossing
    p.add_argument("-f", "--format", choices=sorted(SUFFIX), default="perfetto", help="output format (perfetto)")
    p.add_argument("-o", "--output", metavar="FILE", help="output file (default: RUN's name + the format's suffix)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists (never an input)")
    p.add_argument("--rank", type=int, default=None, help="the rank to export (memory-viz, folded; default: first)")


def run(args: argparse.Namespace) -> int:
    import sys

    from ..outputs import atomic_write, output_file
    from ..progress import task
    from ._runs import check_rank, load_args, select, target_args

    check_rank(args.rank)
    out = output_file(
        args.run_path, args.output, default_suffix=SUFFIX[args.format], suffixes=ACCEPTS[args.format], force=args.force
    )
    run_ = load_args(args)
    if args.format == "perfetto":
        from ..analysis.target import resolve_target
        from ..exporters.perfetto import export_perfetto

        traces = select(run_, args.rank)
        targets = [resolve_target(tr, **target_args(args)) for tr in traces]
        with task(f"Writing {out}", total=len(traces)) as t, atomic_write(out) as tmp:
            export_perfetto(traces, tmp, progress=t, targets=targets)
    elif args.format == "memory-viz":
        from ..exporters.memory_viz import export_memory_viz

        trace = select(run_, args.rank)[0]
        with task(f"Writing {out}", total=2) as t, atomic_write(out) as tmp:
            export_memory_viz(trace, tmp, progress=t)
    else:
        from ..analysis.curves import all_curves
        from ..analysis.flame import flame_at, peak_event_index
        from ..plots.folded import render_folded

        trace = select(run_, args.rank)[0]
        with task(f"Writing {out}", total=None), atomic_write(out) as tmp:
            curves = all_curves(trace)
            k = peak_event_index(curves.allocated, curves.reserved)
            render_folded(flame_at(trace, event_index=k, non_torch=True), tmp)
    print(f"memtrace: wrote {out}", file=sys.stderr)
    return 0
