"""Benchmark: draw the timeline and the flame graph of a 1M-event SYNTHETIC trace (goal: <= 5 s each).

Prints figures; asserts nothing about time (speed goals are not tests). Run:

    python tests/bench/bench_plots.py [N_EVENTS]

Phases timed separately: analysis (curves, categories, phases, crossing, OOM) and drawing for the timeline;
live-set + tree and SVG writing for the flame graph; also the same through the store and the CLI.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _synthetic():
    spec = importlib.util.spec_from_file_location("synthetic_startup", TESTS / "synthetic_startup.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["synthetic_startup"] = mod
    spec.loader.exec_module(mod)
    return mod


def main(n_events: int = 1_000_000) -> None:
    from memtrace.analysis.analysed.run import analyse
    from memtrace.analysis.holders.flame import flame_at
    from memtrace.analysis.memory.curves import all_curves
    from memtrace.cli import main as cli
    from memtrace.plots.flame_svg import render_flame_svg
    from memtrace.plots.folded import render_folded
    from memtrace.plots.timeline import render_timeline
    from memtrace.plots.timeline_data import prepare_rank
    from memtrace.store import save_trace
    from references import peak_event_index

    trace = _synthetic().synthetic_large(n_events)
    print(f"trace: {len(trace.events):,} events, {len(trace.samples):,} NVML samples (SYNTHETIC)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        import matplotlib  # noqa: F401  (import cost is not the renderer's)

        t0 = time.perf_counter()
        rank = prepare_rank(analyse([trace]).ranks[0])
        t1 = time.perf_counter()
        render_timeline([rank], tmp / "t.png")
        t2 = time.perf_counter()
        print(f"plot:  analysis {t1 - t0:.2f} s + drawing {t2 - t1:.2f} s = {t2 - t0:.2f} s (goal <= 5 s)")

        t0 = time.perf_counter()
        curves = all_curves(trace)
        flame = flame_at(trace, event_index=peak_event_index(curves.allocated, curves.reserved))
        t1 = time.perf_counter()
        render_flame_svg(flame, tmp / "f.svg", title="bench")
        render_folded(flame, tmp / "f.folded")
        t2 = time.perf_counter()
        print(f"flame: analysis {t1 - t0:.2f} s + writing {t2 - t1:.2f} s = {t2 - t0:.2f} s (goal <= 5 s)")

        wide = _synthetic().synthetic_large(n_events, n_stacks=5000)
        t0 = time.perf_counter()
        curves = all_curves(wide)
        flame = flame_at(wide, event_index=peak_event_index(curves.allocated, curves.reserved))
        t1 = time.perf_counter()
        drawn = render_flame_svg(flame, tmp / "w.svg", title="bench")
        t2 = time.perf_counter()
        print(
            f"flame, 5,000 distinct 40-frame stacks ({len(flame.stacks):,} live paths, {drawn.frames_drawn:,} frames "
            f"drawn, {(tmp / 'w.svg').stat().st_size / 1e6:.1f} MB): {t1 - t0:.2f} s + {t2 - t1:.2f} s"
        )

        save_trace(trace, tmp / "run" / "rank0.memtrace")
        for argv in (
            ["plot", str(tmp / "run"), "-o", str(tmp / "c.png")],
            ["flame", str(tmp / "run"), "-o", str(tmp / "c.svg")],
        ):
            t0 = time.perf_counter()
            rc = cli(argv)
            print(f"memtrace {argv[0]} (load + analyse + draw): {time.perf_counter() - t0:.2f} s, exit {rc}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
