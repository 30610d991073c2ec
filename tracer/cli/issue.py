"""Write a bundle ready to paste into an upstream issue: Markdown plus the timeline and flame images.

DIR (default: RUN's name + "-issue") receives:

  issue.md      environment fingerprint (GPU, compute capability, driver, CUDA, torch, vLLM,
                FlashInfer, the command and flags), a one-paragraph summary, the per-phase table,
                the peak, the crossing of the --gpu-memory-utilization target, the top holders at
                the peak and the FlashInfer workspace calls, with the images linked
  timeline.png  GPU memory over time by category, the target line and the first crossing
  flame.svg     what held memory at the peak (reserved; allocated for the CPU's traces) and flame.folded
                for speedscope / flamegraph.pl

  *.memtrace.xz with --attach-trace: each trace of the run, compressed (every memtrace command reads it)

issue.md answers first: the verdict (died, crossed, within the target, recorded nothing), the peak, the
target, who held the memory and the hooked workspace bytes, then the timeline, then the environment; the
long tables are folded. Attach the images to the issue (GitHub uploads them when dropped into the text
box). A run that recorded no allocator event gets issue.md alone, says so first, and exits 1. A DIR that
already holds these files is only replaced with --force.

  memtrace issue RUN
  memtrace issue RUN -o issue/ --force --attach-trace
"""

from __future__ import annotations

import argparse

NAME = "issue"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from memtrace.cli._runs import add_input, add_output, add_rank, add_target

    add_input(p)
    add_output(
        p,
        "output directory (default: RUN's name + '-issue')",
        metavar="DIR",
        force="replace the files of an existing bundle",
    )
    add_rank(p, "the rank to describe (default: every rank)")
    p.add_argument(
        "--attach-trace", action="store_true", help="also write each trace compressed (.memtrace.xz) for attaching"
    )
    add_target(p)


def run(args: argparse.Namespace) -> int:
    import sys

    from memtrace.analysis.analysed.summary import summary_doc
    from memtrace.analysis.analysed.verdict import NOTHING
    from memtrace.attach import attached_name, write_attachment
    from memtrace.cli._runs import analysed
    from memtrace.outputs import atomic_write, make_dir, output_dir
    from memtrace.plots.issue_md import FILES
    from memtrace.plots.render import render
    from memtrace.progress import task

    out = output_dir(args.run_path, args.output, default_suffix="-issue", files=FILES, force=args.force)
    run_ = analysed(args, top=8)
    attached = [attached_name(r.trace) for r in run_.ranks] if args.attach_trace else []
    if attached:  # the same policy for the attachments' names, now that they are known
        output_dir(args.run_path, out, default_suffix="-issue", files=tuple(attached), force=args.force)
    with task("Writing the issue bundle", total=None):
        summary_doc(run_.worst)  # the input read and its figures computed before the folder is made
        make_dir(out)
        written = render(run_, out, "issue")
        for stale in set(FILES) - set(written):  # --force over an older bundle: no picture it did not draw
            (out / stale).unlink(missing_ok=True)
        for r, name in zip(run_.ranks, attached, strict=False):  # [] without --attach-trace
            with atomic_write(out / name) as tmp:
                write_attachment(r.trace, tmp)
    names = [*written, *attached]
    print(f"memtrace: wrote {out}/{names[0]}" + "".join(f", {n}" for n in names[1:]), file=sys.stderr)
    if run_.verdict == NOTHING:
        print(
            f"memtrace: {out}/issue.md says the run recorded nothing: no picture, no peak; not passed", file=sys.stderr
        )
        return 1
    return 0
