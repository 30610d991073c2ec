"""What serving mode costs a vLLM scheduler step, from a real serving trace's own measurements (issue 30).

    python3 tests/bench/serving_cost_model.py [TRACE_OR_RUN_DIR]   # default: the shipped H200 serving OOM

Not a throughput benchmark: it prices one step from components the trace measured on the GPU machine, so that
the cost can be split where it is spent (whole-server throughput rounds spread by 21 % on their own):

- the step: the median decode step of the window's scheduler steps (all requests decoding, one token each),
  its duration, and the allocator events and allocations recorded inside it;
- PyTorch's recording of an allocation: start-up's calibration (``memtrace.self_cost`` fact: ns per allocation
  at its depth, ns per frame beyond it) at the window's mean allocation stack depth;
- a drain of PyTorch's history (``MEMTRACE_SERVING_DRAIN_S`` > 0): the snapshot and conversion time per event of
  the trace's own large drains (``capture`` fact), on the engine process's GIL.

It prints both ways of keeping the events: drained (every event snapshotted and converted while serving) and
held in PyTorch's ring (the default: nothing converted while serving; ``free_requested`` not recorded). The
calibration's price of PyTorch's recording runs low inside vLLM's engine: on the H100 the eager decode steps took
0.5-0.9 ms longer with Python stacks than without, where it prices 0.16-0.21 ms
(``tests/data/vllm-h100-034-serving``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from memtrace import facts as F
from memtrace.model import ACTION_CODE
from memtrace.store import load_run

DEFAULT = Path(__file__).parents[1] / "data" / "vllm-h200-034-serving" / "oom"
BIG_DRAIN = 50_000  # events: drains this large price an event (small ones are dominated by fixed costs)


def main(argv: list[str]) -> int:
    trace = load_run(argv[0] if argv else DEFAULT).traces[0]
    w = trace.window
    if w is None or not w.steps:
        print(f"{trace.path}: no serving window with scheduler steps", file=sys.stderr)
        return 2
    ev = w.events
    t0 = np.array([s["time_us"] for s in w.steps])
    dur = np.array([s.get("duration_us", 0) for s in w.steps])
    decode = np.array([s.get("tokens") == s.get("requests") for s in w.steps])
    lo, hi = np.searchsorted(ev["time_us"], t0), np.searchsorted(ev["time_us"], t0 + dur)

    def per_step(mask: np.ndarray) -> np.ndarray:
        c = np.concatenate([[0], np.cumsum(mask)])
        return c[hi] - c[lo]

    alloc = ev["action"] == ACTION_CODE["alloc"]
    fr = ev["action"] == ACTION_CODE["free_requested"]
    step_us = float(np.median(dur[decode]))
    events, allocs = (
        float(np.median(per_step(np.ones(len(ev), bool))[decode])),
        float(np.median(per_step(alloc)[decode])),
    )
    held_events = events - float(np.median(per_step(fr)[decode]))
    cal = (trace.facts.get(F.SELF_COST) or {}).get("history") or {}
    if not cal.get("measured"):
        print(f"{trace.path}: no history calibration in the trace", file=sys.stderr)
        return 2
    depths = np.array([len(s) for s in trace.stacks] + [0])
    depth = float(depths[ev["stack"][alloc]].mean()) if alloc.any() else float(cal["depth"])
    record_ns = cal["per_alloc_ns"] + cal["per_frame_ns"] * max(depth - cal["depth"], 0.0)
    drains = [
        d for d in (trace.facts.get(F.CAPTURE) or {}).get("drains", {}).get("first", []) if d["events"] >= BIG_DRAIN
    ]
    print(Path(trace.path).name)
    print(
        f"  decode step (median of {int(decode.sum())} of {len(w.steps)} steps): {step_us / 1e3:.2f} ms, "
        f"{events:.0f} allocator events ({held_events:.0f} without free_requested), {allocs:.0f} allocations"
    )
    print(
        f"  PyTorch's recording: {record_ns:.0f} ns an allocation (calibration {cal['per_alloc_ns']:.0f} ns at depth "
        f"{cal['depth']} + {cal['per_frame_ns']:.1f} ns a frame; window's mean depth {depth:.1f})"
    )
    recording_us = allocs * record_ns / 1e3
    print(f"  held in PyTorch's ring (default): {recording_us / 1e3:.3f} ms a step = {recording_us / step_us:.2%}")
    if drains:
        snap = np.mean([d["snapshot_s"] / d["events"] for d in drains]) * 1e6
        conv = np.mean([d["convert_s"] / d["events"] for d in drains]) * 1e6
        drain_us = events * (snap + conv)
        print(
            f"  drained (MEMTRACE_SERVING_DRAIN_S > 0): + {(snap + conv):.2f} µs an event (snapshot {snap:.2f}, "
            f"convert {conv:.2f}; {len(drains)} drains of >= {BIG_DRAIN:,} events) = {drain_us / 1e3:.3f} ms a step; "
            f"with the recording {(drain_us + recording_us) / step_us:.2%}"
        )
    else:
        print(f"  drained: no drain of >= {BIG_DRAIN:,} events in this trace to price one by")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
