"""Write a run in another tool's format: Perfetto/Chrome JSON, a memory_viz snapshot, folded stacks.

  perfetto    trace-event JSON for ui.perfetto.dev / chrome://tracing: counter tracks for the
              allocated, reserved, device-used and non-PyTorch curves, slices for phases and hook
              calls, one process track per traced process (every rank)
  memory-viz  a torch.cuda.memory._snapshot()-shaped pickle (protocol 4) for pytorch.org/memory_viz
              (one rank: --rank, default the first)
  folded      folded stacks of what was live at the peak, for speedscope / flamegraph.pl (one rank)

The output defaults to RUN's name plus .perfetto.json, .memory_viz.pickle or .folded in the current
directory; an existing file is only replaced with --force.

  memtrace export RUN --format perfetto
  memtrace export RUN --format memory-viz -o startup.pickle
"""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "export"
ORDER = 60

SUFFIX = {"perfetto": ".perfetto.json", "memory-viz": ".memory_viz.pickle", "folded": ".folded"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_path", metavar="RUN", help="run directory or .memtrace file")
    p.add_argument("-f", "--format", choices=sorted(SUFFIX), default="perfetto", help="output format (perfetto)")
    p.add_argument("-o", "--output", metavar="FILE", help="output file (default: RUN's name + the format's suffix)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    p.add_argument("--rank", type=int, default=None, help="the rank to export (memory-viz, folded; default: first)")


def output_path(run_path: str, fmt: str, output: str | None, force: bool) -> Path:
    """Where to write; UsageError when it exists and --force was not given."""
    from ..errors import UsageError

    if output:
        out = Path(output)
    else:
        name = Path(run_path.rstrip("/")).name
        for suffix in (".memtrace",):
            name = name.removesuffix(suffix)
        out = Path(name + SUFFIX[fmt])
    if out.exists() and not force:
        raise UsageError(f"{out} already exists; choose another file with -o or pass --force to replace it")
    if out.is_dir():
        raise UsageError(f"{out} is a directory; give a file name with -o")
    return out


def run(args: argparse.Namespace) -> int:
    import sys

    from ..progress import task
    from ._runs import load_with_progress, select

    out = output_path(args.run_path, args.format, args.output, args.force)
    run_ = load_with_progress(args.run_path)
    if args.format == "perfetto":
        from ..exporters.perfetto import export_perfetto

        traces = select(run_, args.rank)
        with task(f"Writing {out}", total=len(traces)) as t:
            export_perfetto(traces, out, progress=t)
    elif args.format == "memory-viz":
        from ..exporters.memory_viz import export_memory_viz

        trace = select(run_, args.rank)[0]
        with task(f"Writing {out}", total=2) as t:
            export_memory_viz(trace, out, progress=t)
    else:
        from ..analysis.curves import all_curves
        from ..analysis.flame import flame_at, peak_event_index
        from ..plots.folded import render_folded

        trace = select(run_, args.rank)[0]
        with task(f"Writing {out}", total=None):
            curves = all_curves(trace)
            render_folded(flame_at(trace, event_index=peak_event_index(curves.allocated, curves.reserved)), out)
    print(f"memtrace: wrote {out}", file=sys.stderr)
    return 0
