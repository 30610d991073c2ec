"""Draw what held GPU memory at one moment: a flame graph of the live allocations by stack.

The widest frames are the code that allocated the memory live at that moment; FlashInfer's
workspace allocators appear as frames of their own ("[hook] allocate_sm120_dynamic_workspace").
Every box says its function, line and bytes, without hovering.

--at picks the moment: "peak" (the run's peak, as report states it: from vLLM 0.34, what the process
held, PyTorch reserved + the KV cache committed outside PyTorch; else the peak of PyTorch's reserved
memory, with the allocation that caused it), "oom" (right before the failed allocation), a time since the
start (7.05, 7.05s, 7050ms, 7050000us), or a phase (its name or path: the moment of its highest allocated
memory).
--added keeps only what the phase of that moment allocated and still held then (profile_run's
activations, capture's CUDA-graph pools); --since PHASE|TIME keeps what was allocated from then on.

When the trace holds CUPTI records (recorded with MEMTRACE_CUPTI=1), the non-PyTorch device memory
CUPTI saw live at that moment is drawn too, under its own frame "[non-PyTorch, CUPTI]", then its
category ("[kernel modules' statics]") and its Python stack; --torch-only leaves it out (to compare
with a run recorded without CUPTI). From vLLM 0.34 the KV cache committed through CUDA's VMM API,
outside PyTorch, has a frame of its own too, "[KV cache outside PyTorch (CUDA VMM)]", then the Python
stack that committed it (--torch-only leaves it out as well).

-f/--format svg (default) or folded: "frame;frame bytes" lines for speedscope or flamegraph.pl,
which add up to the live bytes exactly (PyTorch's allocated bytes, plus what CUPTI saw and the KV cache
committed through CUDA VMM). The SVG
needs no network.

  memtrace flame RUN                         # writes <run>-flame.svg at the peak
  memtrace flame RUN --at profile_run --added
  memtrace flame RUN --at oom -f folded      # writes <run>-flame.folded
  memtrace flame RUN --at 7050ms --rank 1
"""

from __future__ import annotations

import argparse
import sys

NAME = "flame"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from memtrace.cli._runs import add_input, add_output, add_rank

    add_input(p)
    p.add_argument("--at", default="peak", metavar="peak|oom|TIME|PHASE", help="the moment to show (default: peak)")
    window = p.add_mutually_exclusive_group()
    window.add_argument("--added", action="store_true", help="only what the moment's phase allocated and still held")
    window.add_argument("--since", metavar="PHASE|TIME", help="only what was allocated from then on and still held")
    p.add_argument(
        "--torch-only",
        action="store_true",
        help="leave out the memory outside PyTorch: what CUPTI recorded, the KV cache committed through CUDA VMM",
    )
    add_output(p, "file to write (default: <run>-flame.svg or .folded)")
    from memtrace.plots.render import offered_by

    p.add_argument("-f", "--format", choices=sorted(offered_by(NAME)), default=None, help="svg (default) or folded")
    add_rank(
        p,
        "the rank to show (default: the run's worst rank: the first to die, else the largest overshoot, else the highest peak)",
    )


def _format(args: argparse.Namespace) -> str:
    from pathlib import Path

    if args.format is not None:
        return args.format
    suffix = Path(args.output).suffix.lower() if args.output else ""
    from memtrace.plots.render import offered_by

    return "folded" if suffix in offered_by(NAME)["folded"].suffixes else "svg"


def run(args: argparse.Namespace) -> int:
    from memtrace.cli._runs import analysed, events_only
    from memtrace.outputs import atomic_write, output_file
    from memtrace.plots.render import offered_by, render
    from memtrace.progress import task

    fmt = offered_by(NAME)[_format(args)]
    out = output_file(args.run_path, args.output, default_suffix=fmt.suffix, suffixes=fmt.suffixes, force=args.force)
    run_ = events_only(analysed(args), "show")
    options = {"at": args.at, "since": args.since, "added": args.added, "torch_only": args.torch_only}
    with task(f"Drawing {out}", total=None), atomic_write(out) as tmp:
        render(run_, tmp, fmt.name, **options, log=sys.stderr)
    print(f"memtrace: wrote {out}", file=sys.stderr)
    return 0
