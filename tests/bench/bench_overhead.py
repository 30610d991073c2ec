"""What tracing costs a realistic GPU workload: wall time (goal ≤ 2 % with Python stacks) and GPU bytes (goal 0).

The workload: a real small transformer (``torch.nn.TransformerEncoder``, random weights, bf16) built,
run for forward passes at a few batch shapes, then captured into a CUDA graph and replayed. The same
workload runs untraced and traced (``stacks="python"``, sidecar at 1 kHz), alternating, several times
in ONE process; the figure is the ratio of the medians. GPU bytes tracing adds: NVML device-used at
the end of the workload (everything still alive), traced minus untraced, plus the device-used change
across ``memtrace.start()`` itself. Prints figures; asserts nothing (speed goals are not tests).

    python tests/bench/bench_overhead.py [--repeats 5] [--stacks python] [--all-variants]

``--all-variants`` also runs the traced workload without the NVML sidecar (``MEMTRACE_SAMPLE_HZ=0``),
with synchronous drains (``MEMTRACE_CAPTURE_SYNC=1``) and without stacks, alternating with the
others, to say which part of capture costs what; each line also gives the time memtrace's own calls
took on the program's threads (``facts["memtrace.self_cost"]["total_ns"]``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import memtrace
from memtrace import facts as F


def nvml_used(handle) -> int:
    import pynvml

    return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)


def workload(torch, steps: int) -> int:
    """Build, run and capture a transformer; returns the NVML device-used bytes at the end."""
    dev = "cuda"
    layer = torch.nn.TransformerEncoderLayer(D, 16, 4 * D, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).to(dev, torch.bfloat16).eval()
    with torch.inference_mode():
        for step in range(steps):
            batch, seq = ((8, 1024), (16, 512), (4, 2048))[step % 3]
            x = torch.randn(batch, seq, D, device=dev, dtype=torch.bfloat16)
            model(x)
        static = torch.randn(8, 1024, D, device=dev, dtype=torch.bfloat16)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            model(static)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static)
        for _ in range(steps):
            graph.replay()
        torch.cuda.synchronize()
    used = (nvml_used(HANDLE), torch.cuda.memory_reserved())
    del graph, out, model, static
    return used


def main() -> None:
    global HANDLE
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--stacks", default="python")
    p.add_argument(
        "--all-variants",
        action="store_true",
        help="also without the NVML sidecar, with synchronous drains and without stacks (what each part costs)",
    )
    a = p.parse_args()
    import pynvml
    import torch

    pynvml.nvmlInit()
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    HANDLE = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else "GPU-" + uuid)
    workload(torch, 6)  # warm-up: cuBLAS handles, kernels, caching allocator
    variants = {
        "untraced": None,
        f"traced ({a.stacks} stacks)": ({}, a.stacks),
        "traced, no NVML sidecar": ({"MEMTRACE_SAMPLE_HZ": "0"}, a.stacks),
        "traced, synchronous drains": ({"MEMTRACE_CAPTURE_SYNC": "1"}, a.stacks),
        "traced, no stacks": ({}, "none"),
    }
    if not a.all_variants:
        variants = dict(list(variants.items())[:2])
    times: dict[str, list[float]] = {k: [] for k in variants}
    used: dict[str, list] = {k: [] for k in variants}
    spent: dict[str, list[float]] = {k: [] for k in variants}
    start_delta, start_s, stop_s = [], [], []
    events = drains = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeats):
            order = list(variants) if i % 2 == 0 else list(variants)[::-1]  # alternate, so drift weighs alike
            for name in order:
                spec = variants[name]
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                if spec is not None:
                    env, stacks = spec
                    saved = {k: os.environ.get(k) for k in env}
                    os.environ.update(env)
                    before = nvml_used(HANDLE)
                    s0 = time.perf_counter()
                    session = memtrace.start(f"{tmp}/r{i}-v{list(variants).index(name)}", stacks=stacks)
                    start_s.append(time.perf_counter() - s0)
                    time.sleep(0.05)
                    start_delta.append(nvml_used(HANDLE) - before)
                t0 = time.perf_counter()
                with memtrace.phase("workload"):
                    used[name].append(workload(torch, a.steps))
                times[name].append(time.perf_counter() - t0)
                if spec is not None:
                    s0 = time.perf_counter()
                    memtrace.stop()
                    stop_s.append(time.perf_counter() - s0)
                    for k, v in saved.items():  # as it was before this variant
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
                    tr = memtrace.load(session.path).traces[0]
                    events, drains = len(tr.events), tr.facts["capture"]["drains"]
                    spent[name].append(tr.facts[F.SELF_COST]["total_ns"] / 1e9)
    off = statistics.median(times["untraced"])
    for name in variants:
        on = statistics.median(times[name])
        extra = f"; memtrace on the program's threads {statistics.median(spent[name]):.3f} s" if spent[name] else ""
        print(f"{name:32s} median {on:.3f} s  ratio {on / off:.4f} ({(on / off - 1) * 100:+.2f} %){extra}")
    print(f"goal: traced <= +2 %; runs: { {k: [round(t, 3) for t in v] for k, v in times.items()} }")
    traced = list(variants)[1]
    print(f"events per traced run: {events}; drains of the last run: {drains}")
    nvml = {k: statistics.median(u for u, _ in used[k]) for k in ("untraced", traced)}
    non_torch = {k: statistics.median(u - r for u, r in used[k]) for k in ("untraced", traced)}
    print(f"NVML device-used at workload end, traced - untraced: {nvml[traced] - nvml['untraced']:.0f} bytes")
    print(
        f"non-PyTorch bytes (NVML used - reserved) at workload end, traced - untraced: "
        f"{non_torch[traced] - non_torch['untraced']:.0f} bytes (goal 0)"
    )
    print(f"memtrace.start() took {[round(x, 3) for x in start_s]} s, stop() {[round(x, 3) for x in stop_s]} s")
    print(f"NVML device-used change across memtrace.start(): {start_delta} bytes")


HANDLE = None
D = 2048  # model width: 12 layers of d=2048 at 8k tokens keep the GPU, not the CPU, the bottleneck

if __name__ == "__main__":
    main()
