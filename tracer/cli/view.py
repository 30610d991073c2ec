"""Write one self-contained HTML page to explore a run: zoom, hover, click a moment to see what was live.

The page shows the timeline (allocated by category, reserved, NVML device used, the non-PyTorch band,
phases, the target, the card's capacity, the crossing and the OOM), zooms by drag and wheel down to
single allocator events, and shows at any clicked moment (or a landmark: peak, first crossing, OOM,
end of each phase) the live allocations as an icicle by stack, the top holders and the events around.
Everything is inline: it opens from disk with no network. A run with more than --max-events events
per page carries a coarse overview; `--serve` then answers the page's zoom and click queries from the
trace on 127.0.0.1 (a free port; Ctrl-C stops it).

  memtrace view RUN                       # writes <run>-view.html
  memtrace view RUN -o run.html --force --util 0.85
  memtrace view --serve RUN               # http://127.0.0.1:PORT/ until Ctrl-C
"""

from __future__ import annotations

import argparse
import sys

NAME = "view"
DEFAULT_MAX_EVENTS = 4_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    from memtrace.cli._runs import add_input, add_output, add_rank, add_target

    add_input(p)
    add_output(p, "page to write (default: <run>-view.html)", force="replace FILE if it exists")
    add_rank(p, "only this rank (default: every rank, one lane each)")
    add_target(p)
    p.add_argument("--serve", action="store_true", help="serve the page on 127.0.0.1 and answer its queries")
    p.add_argument("--port", type=int, default=0, help="port for --serve (default: a free one)")
    p.add_argument(
        "--max-events",
        type=int,
        default=DEFAULT_MAX_EVENTS,
        metavar="N",
        help=f"events per page above which the page carries an overview only (default {DEFAULT_MAX_EVENTS:,})",
    )


def run(args: argparse.Namespace) -> int:
    from memtrace.cli._runs import analysed, events_only
    from memtrace.errors import UsageError
    from memtrace.outputs import atomic_write, output_file
    from memtrace.plots.render import render
    from memtrace.progress import task

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: give a port from 1 to 65535, or 0 for a free one")
    if args.max_events < 1:
        raise UsageError(f"--max-events {args.max_events}: give how many events a page may carry, 1 or more")
    out = None
    if not args.serve:
        out = output_file(
            args.run_path, args.output, default_suffix="-view.html", suffixes=(".html",), force=args.force
        )
    run_ = events_only(analysed(args), "view")
    if args.serve:
        from memtrace.cli._serve import serve

        return serve(run_, port=args.port, max_events=args.max_events)
    with task(f"Writing {out}", total=None), atomic_write(out) as tmp:
        render(run_, tmp, "view", max_events=args.max_events)
    print(f"memtrace: wrote {out}", file=sys.stderr)
    return 0
