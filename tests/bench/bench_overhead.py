"""What tracing costs a realistic GPU workload: wall time (goal ≤ 2 % with Python stacks) and GPU bytes (goal 0).

The workload: a real small transformer (``torch.nn.TransformerEncoder``, random weights, bf16) built,
run for forward passes at a few batch shapes, then captured into a CUDA graph and replayed. The same
workload runs untraced and traced (``stacks="python"``, sidecar at 1 kHz), alternating, several times
in ONE process; the figure is the ratio of the medians. GPU bytes tracing adds: NVML device-used at
the end of the workload (everything still alive), traced minus untraced, plus the device-used change
across ``memtrace.start()`` itself. Prints figures; asserts nothing (speed goals are not tests).

    python tests/bench/bench_overhead.py [--repeats 5] [--stacks python]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import memtrace


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
    a = p.parse_args()
    import pynvml
    import torch

    pynvml.nvmlInit()
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    HANDLE = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else "GPU-" + uuid)
    workload(torch, 6)  # warm-up: cuBLAS handles, kernels, caching allocator
    times = {False: [], True: []}
    used = {False: [], True: []}
    start_delta, start_s, stop_s = [], [], []
    events = drains = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeats):
            for traced in (False, True) if i % 2 == 0 else (True, False):
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                if traced:
                    before = nvml_used(HANDLE)
                    s0 = time.perf_counter()
                    session = memtrace.start(f"{tmp}/r{i}", stacks=a.stacks)
                    start_s.append(time.perf_counter() - s0)
                    time.sleep(0.05)
                    start_delta.append(nvml_used(HANDLE) - before)
                t0 = time.perf_counter()
                with memtrace.phase("workload"):
                    used[traced].append(workload(torch, a.steps))
                times[traced].append(time.perf_counter() - t0)
                if traced:
                    s0 = time.perf_counter()
                    memtrace.stop()
                    stop_s.append(time.perf_counter() - s0)
                    tr = memtrace.load(session.path).traces[0]
                    events, drains = len(tr.events), tr.facts["capture"]["drains"]
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"untraced: median {off:.3f} s  {[round(t, 3) for t in times[False]]}")
    print(f"traced ({a.stacks} stacks): median {on:.3f} s  {[round(t, 3) for t in times[True]]}")
    print(f"wall-time ratio traced/untraced: {on / off:.4f}  ({(on / off - 1) * 100:+.2f} %, goal <= +2 %)")
    print(f"events per traced run: {events}; drains of the last run: {drains}")
    nvml = {k: statistics.median(u for u, _ in v) for k, v in used.items()}
    non_torch = {k: statistics.median(u - r for u, r in v) for k, v in used.items()}
    print(f"NVML device-used at workload end, traced - untraced: {nvml[True] - nvml[False]:.0f} bytes")
    print(
        f"non-PyTorch bytes (NVML used - reserved) at workload end, traced - untraced: "
        f"{non_torch[True] - non_torch[False]:.0f} bytes (goal 0)"
    )
    print(f"memtrace.start() took {[round(x, 3) for x in start_s]} s, stop() {[round(x, 3) for x in stop_s]} s")
    print(f"NVML device-used change across memtrace.start(): {start_delta} bytes")


HANDLE = None
D = 2048  # model width: 12 layers of d=2048 at 8k tokens keep the GPU, not the CPU, the bottleneck

if __name__ == "__main__":
    main()
