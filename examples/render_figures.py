"""Render the README's figures from the real trace they come from: the timeline and the flame graphs.

    python examples/render_figures.py --out /tmp/figures   # the README's figures, from their source
    python examples/render_figures.py --added profile_run --added capture_model --out docs --force
                                                           # docs/ as the README shows it

The README's figures (``docs/timeline.png``, ``docs/flame.svg``, ``docs/flame-profile_run.svg``,
``docs/flame-capture_model.svg``) are drawn from ``tests/data/vllm-h200/startup-stacks``: the real vLLM
0.25.1 start-up on the H200 with Python stacks (the default RUN). Writes ``timeline.png``, ``flame.svg``
and ``flame.folded`` (what was live at ``--flame-at``, default the peak) into ``--out`` (default
``docs``), and with ``--added PHASE`` (repeatable) also ``flame-PHASE.svg``: what that phase allocated
and still held at its fullest moment. It goes through the analysed run and the renderers ``memtrace
plot`` and ``memtrace flame`` use (titles from the traces' facts) and prints what they drew: the
crossing, the OOM, and the widest frames of each flame graph.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


#: Where the README's figures come from.
README_RUN = ROOT / "tests" / "data" / "vllm-h200" / "startup-stacks"


def default_run() -> Path:
    """The run the README's figures are drawn from (:data:`README_RUN`)."""
    if not any(README_RUN.glob("*.memtrace*")):  # shipped xz-compressed (*.memtrace.xz): memtrace reads it so
        raise SystemExit(f"{README_RUN}: the README's source trace is missing; pass a run directory")
    return README_RUN


def _analysed(path: Path):
    from memtrace.analysis.analysed.run import analyse
    from memtrace.store import load_run

    run = analyse(load_run(path).traces, path=str(path))
    ranks = run.with_events()
    if not ranks:
        raise SystemExit(f"{path}: no trace with allocator events")
    return run.subset(ranks)


def _flame(run, at: str, added: bool, svg: Path, folded: Path | None) -> None:
    from memtrace.analysis.analysed.titles import flame_titles
    from memtrace.analysis.holders.flame import widest_leaves
    from memtrace.analysis.holders.moment import flame_for
    from memtrace.plots.flame_svg import render_flame_svg
    from memtrace.plots.folded import render_folded
    from memtrace.plots.oom_text import details
    from memtrace.units import format_gib

    rank = run.worst
    moment, flame = flame_for(rank, at, added=added, non_torch=False)
    words = details(rank.oom, rank.trace.process.device_total_bytes) if rank.oom is not None else ""
    title, subtitle = flame_titles(rank, flame, moment, fallback=Path(run.path).name, oom_words=words)
    render_flame_svg(flame, svg, title=title, subtitle=subtitle)
    if folded is not None:
        render_folded(flame, folded)
    for path, nbytes in widest_leaves(flame, 3):
        print(f"{svg.name}: {format_gib(nbytes)}  {path[-1]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "run",
        nargs="?",
        type=Path,
        help="run directory or .memtrace file (default: the README's, vllm-h200/startup-stacks)",
    )
    p.add_argument("--flame-run", type=Path, help="run for the flame graphs (default: RUN)")
    p.add_argument("--flame-at", default="peak", help="the flame graph's moment: peak, oom, a time or a phase")
    p.add_argument("--added", metavar="PHASE", action="append", default=[], help="also flame-PHASE.svg (repeatable)")
    p.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the figures (default: docs)")
    p.add_argument("--force", action="store_true", help="replace figures that exist")
    args = p.parse_args(argv)

    from memtrace.analysis.analysed.titles import timeline_title
    from memtrace.plots.timeline import render_timeline
    from memtrace.plots.timeline_data import prepare_rank

    run_path = args.run or default_run()
    run = _analysed(run_path)
    args.out.mkdir(parents=True, exist_ok=True)
    names = ["timeline.png", "flame.svg", "flame.folded"] + [f"flame-{phase}.svg" for phase in args.added]
    outs = {name: args.out / name for name in names}
    clash = [str(o) for o in outs.values() if o.exists() and not args.force]
    if clash:
        raise SystemExit(f"{', '.join(clash)} exist; pass --force to replace them")

    drawn = render_timeline([prepare_rank(r) for r in run.ranks], outs["timeline.png"], title=timeline_title(run),
                            t0_us=run.origin.t0_us, footnote=f"Times: {run.origin.sentence}")  # fmt: skip
    for r in drawn.ranks:
        c = r.crossing
        what = "no crossing" if c is None else f"crossing at {c.time_s:.3f} s in {c.phase_path}; "
        if c is not None:
            what += f"highest {c.max_bytes} B ({c.curve}) at {c.max_us}, +{c.overshoot_bytes} B, {c.duration_us} us"
        print(f"timeline {r.label}: {what}" + (f"; {r.oom.text.splitlines()[0]}" if r.oom else ""))

    flame_run = _analysed(args.flame_run) if args.flame_run is not None else run
    _flame(flame_run, args.flame_at, False, outs["flame.svg"], outs["flame.folded"])
    for phase in args.added:
        _flame(flame_run, phase, True, outs[f"flame-{phase}.svg"], None)
    print(f"wrote {', '.join(str(o) for o in outs.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
