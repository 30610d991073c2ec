"""What capture costs the traced thread at vLLM's phase boundaries and at the end of start-up (CPU).

No GPU: a FakeTorch stands in for ``torch.cuda`` (the parts ``capture/allocator_history.py`` uses) and hands
out ``_snapshot()`` dicts shaped like torch's (a fresh frames list per entry, shared frame dicts;
segments with blocks and their frames), built from the SYNTHETIC start-up of
``bench_store_report.build`` (realistic stack depth and count). Everything else is memtrace's real
capture code: a Session writing a real trace file, its drains, conversion, SQLite writes, facts.
The time torch itself spends building the snapshot (C++ to Python dicts: ~0.03 s for 16,700
entries on the H200) is not in these figures.

A vLLM-shaped start-up is replayed: nested phases each allocating their share of the entries, the
plugin's facts at every phase edge (``vllm_boundaries``-style readings, a growing list), then
``close("startup-complete")``. Printed: per-boundary cost on the traced thread (median, max,
total), set_fact, close, and the time until the trace file is complete; for the synchronous
capture with the frees' stacks (the behaviour before), the synchronous capture with allocation stacks
only (``MEMTRACE_CAPTURE_SYNC=1``), and the default (background writer, allocation stacks only).
Then the whole replay's wall time with some work per phase, GIL released (GPU-bound) or held
(Python-bound), minus the same replay untraced: a background thread still takes the GIL it needs.

    python tests/bench/bench_capture_cost.py [--events 30000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from bench_store_report import build  # noqa: E402
from capture_fakes import FakeTorch, session_with  # noqa: E402
from memtrace.store import load_trace  # noqa: E402
from references import snapshot_dict  # noqa: E402

#: (phase, parent index or None, share of the entries allocated inside it)
PHASES = [
    ("load_model", None, 0.10),
    ("determine_available_memory", None, 0.02),
    ("profile_run", 1, 0.40),
    ("kv_cache_init", None, 0.01),
    ("compile_or_warm_up", None, 0.02),
    ("kernel_warmup", 4, 0.10),
    ("capture_model", 4, 0.35),
]


def spin(n: int) -> None:
    """A fixed amount of pure-Python work (holds the GIL: vLLM's Python-side work)."""
    x = 0
    for i in range(n):
        x += i


def calibrate(seconds: float) -> int:
    n = 200_000
    t0 = time.perf_counter()
    spin(n)
    return int(n * seconds / (time.perf_counter() - t0))


def untraced(snap: dict, n_events: int, work) -> float:
    """Wall time of the replay with nothing recording (the workload and the fake allocations)."""
    fake = FakeTorch(snap)
    t0 = time.perf_counter()
    for _name, _parent, share in PHASES:
        fake.allocate(int(share * n_events))
        work()
    return time.perf_counter() - t0


def one_startup(snap: dict, d: Path, n_events: int, work=lambda: None, free_stacks: bool | None = None) -> dict:
    path = d / f"t{time.monotonic_ns()}.memtrace"
    wall0 = time.perf_counter()
    s, fake = session_with(snap, path, free_stacks)
    boundary, facts, open_ = [], [], {}
    readings: list[dict] = []

    def edge(name: str, which: str) -> None:
        t0 = time.perf_counter()
        readings.append({"phase": name, "edge": which, "time_us": 0, "free_bytes": 1, "total_bytes": 2})
        s.set_fact("memtrace.phase_memory", list(readings))
        facts.append(time.perf_counter() - t0)

    for i, (name, parent, share) in enumerate(PHASES):
        for j in [k for k in list(open_) if k != parent and (parent is None or k > parent)][::-1]:
            t0 = time.perf_counter()
            s.phase_exit(open_.pop(j))
            boundary.append(time.perf_counter() - t0)
            edge(PHASES[j][0], "end")
        t0 = time.perf_counter()
        open_[i] = s.phase_enter(name, source="vllm")
        boundary.append(time.perf_counter() - t0)
        edge(name, "start")
        fake.allocate(int(share * n_events))
        work()
    for j in sorted(open_, reverse=True):
        t0 = time.perf_counter()
        s.phase_exit(open_.pop(j))
        boundary.append(time.perf_counter() - t0)
        edge(PHASES[j][0], "end")
    t0 = time.perf_counter()
    s.set_fact("startup_complete_us", 1)
    s.close("startup-complete")
    close_s = time.perf_counter() - t0
    wall = time.perf_counter() - wall0
    s.wait_written()
    written_s = time.perf_counter() - t0
    trace = load_trace(path)
    assert len(trace.events) == fake.pos, (len(trace.events), fake.pos)  # lossless
    assert trace.segments, "the final allocator state was not saved"
    return {
        "boundary": boundary,
        "facts": facts,
        "close": close_s,
        "written": written_s,
        "events": len(trace.events),
        "wall": wall,
    }


def report(label: str, runs: list[dict]) -> None:
    b = [x for r in runs for x in r["boundary"]]
    f = [x for r in runs for x in r["facts"]]
    per_run = statistics.median(sum(r["boundary"]) + sum(r["facts"]) + r["close"] for r in runs)
    print(f"{label}:")
    print(
        f"  phase boundary  median {statistics.median(b) * 1e3:7.2f} ms  max {max(b) * 1e3:7.2f} ms"
        f"  ({len(b) // len(runs)} per start-up, total {sum(b) / len(runs) * 1e3:7.1f} ms)"
    )
    print(f"  set_fact        median {statistics.median(f) * 1e3:7.2f} ms  max {max(f) * 1e3:7.2f} ms")
    print(
        f"  close           median {statistics.median(r['close'] for r in runs) * 1e3:7.1f} ms"
        f"  (file complete after {statistics.median(r['written'] for r in runs) * 1e3:7.1f} ms)"
    )
    print(f"  on the traced thread, per start-up: {per_run * 1e3:7.1f} ms  ({runs[0]['events']} events)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=30_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work-s", type=float, default=0.2, help="work per phase in the wall-time comparison")
    args = p.parse_args()
    snap = snapshot_dict(build(args.events))
    n = len(snap["device_traces"][0])
    print(f"{n} entries, {len(snap['segments'])} segments, {sum(len(s['blocks']) for s in snap['segments'])} blocks")
    modes = (
        ("before: synchronous, frees' stacks too", "1", True),
        ("synchronous, allocation stacks only", "1", None),
        ("now: background writer, allocation stacks only", "", None),
    )
    with tempfile.TemporaryDirectory() as d:
        for label, sync, free_stacks in modes:
            os.environ["MEMTRACE_CAPTURE_SYNC"] = sync
            report(label, [one_startup(snap, Path(d), n, free_stacks=free_stacks) for _ in range(args.repeats)])
        # the whole start-up's wall time with work between the boundaries, minus the same untraced
        n_spin = calibrate(args.work_s)
        works = {
            "GPU-bound (the traced thread waits, GIL released)": lambda: time.sleep(args.work_s),
            "Python-bound (the traced thread holds the GIL)": lambda: spin(n_spin),
        }
        print(f"start-up wall time added by capture, {len(PHASES)} phases of {args.work_s:.2f} s work:")
        for wname, work in works.items():
            walls: dict[str, list[float]] = {"untraced": []} | {label: [] for label, _, _ in modes}
            for _ in range(args.repeats):  # interleaved, so a busy machine weighs on all alike
                walls["untraced"].append(untraced(snap, n, work))
                for label, sync, free_stacks in modes:
                    os.environ["MEMTRACE_CAPTURE_SYNC"] = sync
                    walls[label].append(one_startup(snap, Path(d), n, work, free_stacks)["wall"])
            base = statistics.median(walls["untraced"])
            print(f"  {wname}:")
            for label, _, _ in modes:
                wall = statistics.median(walls[label])
                print(f"    {label:50s} +{(wall - base) * 1e3:5.0f} ms ({wall / base:.3f}x)")
    os.environ.pop("MEMTRACE_CAPTURE_SYNC", None)
    print(f"threads left: {[t.name for t in threading.enumerate() if t.name.startswith('memtrace')]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
