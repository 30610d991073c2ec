"""Write a bundle ready to paste into an upstream issue: Markdown plus the timeline and flame images.

DIR (default: RUN's name + "-issue") receives:

  issue.md      environment fingerprint (GPU, compute capability, driver, CUDA, torch, vLLM,
                FlashInfer, the command and flags), a one-paragraph summary, the per-phase table,
                the peak, the crossing of the --gpu-memory-utilization target, the top holders at
                the peak and the FlashInfer workspace calls, with the images linked
  timeline.png  GPU memory over time by category, the target line and the first crossing
  flame.svg     what held memory at the peak (and flame.folded for speedscope / flamegraph.pl)

Attach the images to the issue (GitHub uploads them when dropped into the text box). A DIR that
already holds these files is only replaced with --force.

  memtrace issue RUN
  memtrace issue RUN -o issue/ --force
"""

from __future__ import annotations

import argparse

NAME = "issue"
ORDER = 50

FILES = ("issue.md", "timeline.png", "flame.svg", "flame.folded")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ._runs import add_input, add_target

    add_input(p)
    p.add_argument("-o", "--output", metavar="DIR", help="output directory (default: RUN's name + '-issue')")
    p.add_argument("--force", action="store_true", help="replace the files of an existing bundle")
    p.add_argument("--rank", type=int, default=None, help="the rank to describe (default: every rank)")
    add_target(p)


def run(args: argparse.Namespace) -> int:
    import sys

    from ..analysis import fingerprint
    from ..analysis.curves import all_curves
    from ..analysis.flame import flame_at, peak_event_index
    from ..analysis.landmarks import landmarks
    from ..analysis.oom import find_oom
    from ..analysis.summary import summarize
    from ..analysis.target import resolve_target
    from ..outputs import atomic_write, make_dir, output_dir
    from ..plots.flame_svg import render_flame_svg
    from ..plots.folded import render_folded
    from ..plots.issue_md import IssueRank, render_issue, report_markdown
    from ..plots.timeline import render_timeline
    from ..plots.timeline_data import prepare_rank
    from ..plots.titles import timeline_title
    from ..progress import task
    from ..units import format_gib
    from ._runs import load_args, select, target_args

    out = output_dir(args.run_path, args.output, default_suffix="-issue", files=FILES, force=args.force)
    traces = select(load_args(args), args.rank)
    targets = [resolve_target(t, **target_args(args)) for t in traces]
    with task("Writing the issue bundle", total=3) as t:
        summaries = [summarize(tr, tg.target_bytes, top=8) for tr, tg in zip(traces, targets, strict=True)]
        ranks = [IssueRank(s, landmarks(tr), find_oom(tr)) for tr, s in zip(traces, summaries, strict=True)]
        make_dir(out)  # only once the input read and every figure was computed
        t.advance()
        with atomic_write(out / "timeline.png") as tmp:
            rank_data = [prepare_rank(tr, tg.target_bytes) for tr, tg in zip(traces, targets, strict=True)]
            render_timeline(rank_data, tmp, title=timeline_title(traces[0]))
        t.advance()
        worst = max(range(len(traces)), key=lambda i: summaries[i].peak.reserved_bytes)
        tr, s = traces[worst], summaries[worst]
        curves = all_curves(tr)
        flame = flame_at(tr, event_index=peak_event_index(curves.allocated, curves.reserved), non_torch=True)
        peak_s = (s.peak.time_us - s.start_us) / 1e6
        with atomic_write(out / "flame.svg") as tmp:
            render_flame_svg(
                flame,
                tmp,
                title=f"Live GPU memory at the peak: {peak_s:.3f} s, {s.peak.phase_path or 'outside any phase'}",
                subtitle=f"{tr.label}; reserved {format_gib(s.peak.reserved_bytes)}",
            )
        with atomic_write(out / "flame.folded") as tmp:
            render_folded(flame, tmp)
        t.advance()
    text = render_issue(
        timeline_title(traces[0]),
        ranks,
        fingerprint.environment(traces[0]),
        fingerprint.command_line(traces[0]),
        report_markdown(summaries),
    )
    with atomic_write(out / "issue.md") as tmp:
        tmp.write_text(text, encoding="utf-8")
    print(f"memtrace: wrote {out}/issue.md, timeline.png, flame.svg, flame.folded", file=sys.stderr)
    return 0
