"""Write a bundle ready to paste into an upstream issue: Markdown plus the timeline and flame images.

DIR (default: RUN's name + "-issue") receives:

  issue.md      environment fingerprint (GPU, compute capability, driver, CUDA, torch, vLLM,
                FlashInfer, the command and flags), a one-paragraph summary, the per-phase table,
                the peak, the crossing of the --gpu-memory-utilization target, the top holders at
                the peak and the FlashInfer workspace calls, with the images linked
  timeline.png  GPU memory over time by category, the target line and the first crossing
  flame.svg     what held memory at the reserved peak (and flame.folded for speedscope / flamegraph.pl)

Attach the images to the issue (GitHub uploads them when dropped into the text box). A DIR that
already holds these files is only replaced with --force.

  memtrace issue RUN
  memtrace issue RUN -o issue/ --force
"""

from __future__ import annotations

import argparse

NAME = "issue"
ORDER = 50


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ._runs import add_input, add_output, add_rank, add_target

    add_input(p)
    add_output(
        p,
        "output directory (default: RUN's name + '-issue')",
        metavar="DIR",
        force="replace the files of an existing bundle",
    )
    add_rank(p, "the rank to describe (default: every rank)")
    add_target(p)


def run(args: argparse.Namespace) -> int:
    import sys

    from ..outputs import make_dir, output_dir
    from ..plots.issue_md import FILES
    from ..plots.render import render
    from ..progress import task
    from ._runs import analysed

    out = output_dir(args.run_path, args.output, default_suffix="-issue", files=FILES, force=args.force)
    run_ = analysed(args, top=8)
    with task("Writing the issue bundle", total=None):
        run_.worst.summary  # noqa: B018 (the input read and its figures computed before the folder is made)
        make_dir(out)
        render(run_, out, "issue")
    print(f"memtrace: wrote {out}/issue.md, timeline.png, flame.svg, flame.folded", file=sys.stderr)
    return 0
