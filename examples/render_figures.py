"""Render the README's figures from a real trace shipped in tests/data: the timeline and the peak flame graph.

    python examples/render_figures.py                      # the first H200 run under tests/data
    python examples/render_figures.py tests/data/vllm-h200/startup --flame-run tests/data/h200/startup-cap16g \
        --out docs --force                                 # the README's figures

Writes ``timeline.png`` and ``flame.svg`` (and ``flame.folded``) into ``--out`` (default ``docs``),
through the same functions ``memtrace plot`` and ``memtrace flame`` use, and prints what they drew:
the crossing's time, phase and overshoot, and the widest frames of the flame graph.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def default_run() -> Path:
    """The first run directory (one holding .memtrace files) under tests/data/h200, else tests/data."""
    for base in (ROOT / "tests" / "data" / "h200", ROOT / "tests" / "data"):
        runs = sorted({p.parent for p in base.glob("**/*.memtrace")})
        if runs:
            return runs[0]
    raise SystemExit("no real trace under tests/data yet; pass a run directory")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "run", nargs="?", type=Path, help="run directory or .memtrace file (default: first under tests/data)"
    )
    p.add_argument("--flame-run", type=Path, help="run for the flame graph (default: RUN)")
    p.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the figures (default: docs)")
    p.add_argument("--force", action="store_true", help="replace figures that exist")
    args = p.parse_args(argv)

    from memtrace.analysis.curves import all_curves
    from memtrace.analysis.flame import flame_at, peak_event_index, widest_leaves
    from memtrace.analysis.phases import path_at, recording_span
    from memtrace.plots.flame_svg import render_flame_svg
    from memtrace.plots.folded import render_folded
    from memtrace.plots.timeline import render_timeline
    from memtrace.plots.timeline_data import prepare_rank
    from memtrace.store import load_run
    from memtrace.units import format_gib

    run_path = args.run or default_run()
    run = load_run(run_path)
    traces = [t for t in run.traces if len(t.events)]
    if not traces:
        raise SystemExit(f"{run_path}: no trace with allocator events")
    args.out.mkdir(parents=True, exist_ok=True)
    outs = {name: args.out / name for name in ("timeline.png", "flame.svg", "flame.folded")}
    clash = [str(o) for o in outs.values() if o.exists() and not args.force]
    if clash:
        raise SystemExit(f"{', '.join(clash)} exist; pass --force to replace them")

    env = traces[0].facts.get("env") or {}
    gpu = env.get("gpu_name") or "GPU"
    stood_for = traces[0].facts.get("capacity_bytes")
    if stood_for and traces[0].process.device_total_bytes and stood_for < traces[0].process.device_total_bytes:
        gpu += f" standing for a {format_gib(stood_for, 0)} card"  # a per-process memory fraction
    facts = traces[0].facts
    arch = (facts.get("vllm.config") or {}).get("architecture")
    what = f"vLLM {facts['vllm.version']} start-up" if facts.get("vllm.version") else "GPU memory during start-up"
    title = f"{what}{', ' + arch if arch else ''} ({gpu})"
    drawn = render_timeline([prepare_rank(t) for t in traces], outs["timeline.png"], title=title)
    for r in drawn.ranks:
        c = r.crossing
        what = "no crossing" if c is None else f"crossing at {c.time_s:.3f} s in {c.phase_path}, "
        if c is not None:
            what += f"{format_gib(c.value_bytes)} ({c.curve}), +{format_gib(c.overshoot_bytes)}, {c.duration_us} us"
        print(f"timeline {r.label}: {what}")

    if args.flame_run is not None:
        traces = [t for t in load_run(args.flame_run).traces if len(t.events)] or traces
    trace = max(traces, key=lambda t: all_curves(t).reserved.peak_bytes)
    curves = all_curves(trace)
    k = peak_event_index(curves.allocated, curves.reserved)
    flame = flame_at(trace, event_index=k)
    secs = (flame.time_us - recording_span(trace)[0]) / 1e6
    render_flame_svg(
        flame,
        outs["flame.svg"],
        title=f"Live GPU memory at the peak: {secs:.3f} s, in {path_at(trace, flame.time_us) or 'no phase'}",
        subtitle=f"{format_gib(flame.total_bytes)} allocated; reserved {format_gib(int(curves.reserved.bytes[k + 1]))}"
        f" · {gpu}, {trace.label} · {Path(trace.path).parent.name}",
    )
    render_folded(flame, outs["flame.folded"])
    for path, nbytes in widest_leaves(flame, 3):
        print(f"flame: {format_gib(nbytes)}  {path[-1]}")
    print(f"wrote {', '.join(str(o) for o in outs.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
