"""Benchmark: a 1,000,000-event trace through the store and `memtrace report`; prints figures.

Builds a SYNTHETIC but realistic trace (alloc / free_requested / free_completed churn over 5,000
live slots, 1,500 weight blocks, segment churn, ~2,000 distinct 12-frame stacks, nested vLLM
phases, 100 Hz NVML samples), saves it, then measures in one run:

- save time and store bytes per event;
- load time (``memtrace.store.load_trace``);
- ``memtrace report`` time in-process (``memtrace.cli.main``), and its peak RSS in a fresh process;
- the size of PyTorch's own pickle of the same events (the equivalent ``_snapshot()`` dict pickled
  with the default protocol; no torch needed).

Goals (the first landing's, read here, not tested): load <= 1 s, report <= 2 s, report peak RSS <= 1 GiB. Run:
``python tests/bench/bench_store_report.py [--events N] [--keep DIR] [--no-pickle]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pickle
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from memtrace.model import (
    ACTION_CODE,
    SAMPLE_DTYPE,
    Block,
    Frame,
    HookCall,
    Phase,
    Process,
    Recording,
    Segment,
    Trace,
    empty_events,
)

MiB = 1 << 20
GiB = 1 << 30
T0 = 1_780_000_000_000_000
SLOTS = 5_000
WEIGHTS = 1_500
N_STACKS = 2_000
DEPTH = 12


def build(n_events: int, seed: int = 0) -> Trace:
    """A trace of about ``n_events`` events; see the module docstring."""
    rng = np.random.default_rng(seed)
    # frames and stacks: 2,000 stacks of 12 frames drawn from 6,000 frames, innermost first
    frames = [
        Frame(f"/venv/lib/python3.12/site-packages/vllm/model_executor/layers/mod{i % 300}.py", 10 + i, f"fn_{i}")
        for i in range(6_000)
    ]
    stacks = [tuple(int(x) for x in rng.choice(len(frames), DEPTH, replace=False)) for _ in range(N_STACKS)]
    seg_base, slot_base = 0x7F00_0000_0000, 0x7E00_0000_0000
    head = empty_events(2 * WEIGHTS + 1)
    w = np.arange(WEIGHTS)
    head["action"][0 : 2 * WEIGHTS : 2] = ACTION_CODE["segment_alloc"]
    head["action"][1 : 2 * WEIGHTS : 2] = ACTION_CODE["alloc"]
    head["addr"][0 : 2 * WEIGHTS : 2] = head["addr"][1 : 2 * WEIGHTS : 2] = seg_base + w * 32 * MiB
    head["size"][0 : 2 * WEIGHTS : 2] = 32 * MiB
    head["size"][1 : 2 * WEIGHTS : 2] = 32 * MiB - rng.integers(0, 4096, WEIGHTS)
    head["stack"][1 : 2 * WEIGHTS : 2] = rng.integers(0, 50, WEIGHTS)
    head[-1] = (0, ACTION_CODE["segment_alloc"], slot_base, SLOTS * 2 * MiB, 0, -1)
    # churn: step k frees the block of step k - SLOTS (free_requested, free_completed), then allocs
    steps = max(SLOTS + 1, (int(n_events * 0.996) - len(head) + 2 * SLOTS) // 3 + 1)
    slot = np.arange(steps) % SLOTS
    sizes = rng.integers(512, 2 * MiB, steps)
    churn = empty_events(3 * steps)
    old = np.arange(steps) - SLOTS
    churn["action"][0::3] = ACTION_CODE["free_requested"]
    churn["action"][1::3] = ACTION_CODE["free_completed"]
    churn["action"][2::3] = ACTION_CODE["alloc"]
    for j in range(3):
        churn["addr"][j::3] = slot_base + slot * 2 * MiB
    churn["size"][0::3] = churn["size"][1::3] = np.where(old >= 0, sizes[np.maximum(old, 0)], 0)
    churn["size"][2::3] = sizes
    churn["stack"][0::3] = rng.integers(50, N_STACKS, steps)
    churn["stack"][2::3] = rng.integers(50, N_STACKS, steps)
    churn = churn[~((churn["action"] != ACTION_CODE["alloc"]) & (churn["size"] == 0))]
    ev = np.concatenate((head, churn))
    # a transient segment every 500 events (segment_alloc ... segment_free), like profile_run's
    n_trans = len(ev) // 500
    trans = empty_events(2 * n_trans)
    trans["action"][0::2], trans["action"][1::2] = ACTION_CODE["segment_alloc"], ACTION_CODE["segment_free"]
    trans["addr"][0::2] = trans["addr"][1::2] = 0x7D00_0000_0000 + np.arange(n_trans) * 64 * MiB
    trans["size"] = np.repeat(rng.integers(2, 64, n_trans) * 2 * MiB, 2)
    pos = np.sort(np.concatenate((np.arange(n_trans) * 500 + 10, np.arange(n_trans) * 500 + 60)))
    ev = np.insert(ev, pos, trans)
    ev["time_us"] = T0 + np.linspace(1_000_000, 299_000_000, len(ev)).astype(np.int64)
    # final state: the weight blocks and the churn blocks still live
    live_churn = np.arange(max(steps - SLOTS, 0), steps)
    segments = [Segment(int(seg_base + i * 32 * MiB), 32 * MiB) for i in range(WEIGHTS)]
    for i, s in enumerate(segments):
        s.blocks.append(
            Block(s.address, 32 * MiB, int(head["size"][2 * i + 1]), "active_allocated", int(head["stack"][2 * i + 1]))
        )
    pool = Segment(slot_base, SLOTS * 2 * MiB)
    for k in live_churn:
        pool.blocks.append(
            Block(int(slot_base + (k % SLOTS) * 2 * MiB), 2 * MiB, int(sizes[k]), "active_allocated", 51)
        )
    segments.append(pool)
    phases = [
        Phase("init_device", T0, T0 + 1_000_000, None, "vllm"),
        Phase("load_model", T0 + 1_000_000, T0 + 11_000_000, None, "vllm"),
        Phase("determine_available_memory", T0 + 11_000_000, T0 + 150_000_000, None, "vllm"),
        Phase("profile_run", T0 + 12_000_000, T0 + 140_000_000, 2, "vllm"),
        Phase("initialize_from_config", T0 + 150_000_000, T0 + 160_000_000, None, "vllm"),
        Phase("initialize_kv_cache", T0 + 151_000_000, T0 + 159_000_000, 4, "vllm"),
        Phase("compile_or_warm_up_model", T0 + 160_000_000, T0 + 300_000_000, None, "vllm"),
        Phase("capture_model", T0 + 250_000_000, T0 + 299_500_000, 6, "vllm"),
    ]
    st = np.arange(T0, T0 + 300_000_000, 10_000, dtype=np.int64)
    samples = np.zeros(len(st), dtype=SAMPLE_DTYPE)
    samples["time_us"] = st
    samples["used_bytes"] = 60 * GiB + rng.integers(0, GiB, len(st))
    return Trace(
        process=Process(pid=1, hostname="bench", role="worker", rank=0, device_index=0, device_total_bytes=141 * GiB),
        recording=Recording(start_us=T0, end_us=T0 + 300_000_000),
        events=ev,
        frames=frames,
        stacks=stacks,
        segments=segments,
        phases=phases,
        samples=samples,
        hook_calls=[HookCall("flashinfer.allocate_sm120_dynamic_workspace", T0 + 13_000_000, T0 + 13_002_000)],
        facts={"target_bytes": int(141 * GiB * 0.92), "synthetic": True},
    )


def snapshot_pickle_bytes(trace: Trace) -> int:
    """Bytes of PyTorch's pickle of the same history: ``_snapshot()``'s dicts, default protocol.

    As torch builds them: one dict and one frames list per entry, frame dicts shared between entries.
    """
    names = {v: k for k, v in ACTION_CODE.items()}
    frame_dicts = [{"filename": f.filename, "line": f.line, "name": f.name} for f in trace.frames]
    stack_frames = [[frame_dicts[i] for i in s] for s in trace.stacks]
    ev = trace.events
    entries = [
        {
            "action": names[int(a)],
            "addr": int(addr),
            "size": int(size),
            "stream": 0,
            "time_us": int(t),
            "compile_context": "N/A",
            "user_metadata": "",
            "frames": list(stack_frames[s]) if s >= 0 else [],
        }
        for t, a, addr, size, s in zip(
            ev["time_us"].tolist(),
            ev["action"].tolist(),
            ev["addr"].tolist(),
            ev["size"].tolist(),
            ev["stack"].tolist(),
            strict=True,
        )
    ]
    segments = [
        {
            "device": 0,
            "address": s.address,
            "total_size": s.total_bytes,
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "blocks": [
                {
                    "address": b.address,
                    "size": b.size_bytes,
                    "requested_size": b.requested_bytes,
                    "state": b.state,
                    "frames": list(stack_frames[b.stack]) if b.stack >= 0 else [],
                }
                for b in s.blocks
            ],
        }
        for s in trace.segments
    ]
    snap = {"segments": segments, "device_traces": [entries], "allocator_settings": {}, "external_annotations": []}
    return len(pickle.dumps(snap))


def child_report_rss(path: Path) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of `memtrace report PATH` in a fresh process, the child's alone.

    Measured by ``/usr/bin/time`` (a small process forks the command): a child's ``ru_maxrss`` on Linux
    starts from its forking parent's RSS, so ``getrusage(RUSAGE_SELF)`` inside a child of this big
    process reported this process's memory (the README's old "270 MiB" for `report`).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_scale import measure

    secs, rss, rc, err = measure([sys.executable, "-m", "memtrace", "report", str(path)], path.parent, 600)
    assert rc == 0, err
    return secs, rss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keep", metavar="DIR", help="keep the trace file in DIR")
    ap.add_argument("--no-pickle", action="store_true", help="skip the torch pickle comparison")
    args = ap.parse_args()
    from memtrace.cli import main as cli_main
    from memtrace.store import load_trace, save_trace

    t = time.perf_counter()
    trace = build(args.events)
    print(
        f"built      {len(trace.events):,} events, {len(trace.stacks):,} stacks, {len(trace.samples):,} samples "
        f"in {time.perf_counter() - t:.2f} s"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep or tmp) / "bench.memtrace"
        path.unlink(missing_ok=True)
        t = time.perf_counter()
        save_trace(trace, path)
        save_s = time.perf_counter() - t
        size = path.stat().st_size
        loads = []
        for _ in range(3):
            t = time.perf_counter()
            loaded = load_trace(path)
            loads.append(time.perf_counter() - t)
        assert len(loaded.events) == len(trace.events)
        reports = []
        for _ in range(3):
            t = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()) as buf:
                assert cli_main(["report", str(path)]) == 0
            reports.append(time.perf_counter() - t)
        child_s, child_rss = child_report_rss(path)
        n = len(trace.events)
        print(f"save       {save_s:.2f} s")
        print(f"store      {size:,} bytes = {size / n:.1f} bytes/event (events are 33 bytes raw)")
        print(f"load       {min(loads):.3f} s (best of 3; {', '.join(f'{x:.3f}' for x in loads)})")
        print(f"report     {min(reports):.3f} s in-process (best of 3; {', '.join(f'{x:.3f}' for x in reports)})")
        print(f"report     {child_s:.3f} s in a fresh process incl. imports, peak RSS {child_rss / MiB:.0f} MiB")
        print(
            f"bench RSS  {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (this process, trace built twice)"
        )
        print("report head:", buf.getvalue().splitlines()[0])
        if not args.no_pickle:
            del loaded
            t = time.perf_counter()
            pk = snapshot_pickle_bytes(trace)
            print(
                f"torch pkl  {pk:,} bytes = {pk / n:.1f} bytes/event ({pk / size:.1f}x the store) "
                f"built+pickled in {time.perf_counter() - t:.1f} s"
            )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
