"""GPU check of the optional CUPTI source (issue 15): non-PyTorch allocations with their Python stacks.

Run on the GPU machine, from the repository root (cupti-python and pyelftools carried as wheels)::

    python3 -m pip install -q --no-index --no-deps --target /tmp/cupti .whlcupti/*.whl
    python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/mt .
    PYTHONPATH=/tmp/cupti:/tmp/mt python3 tests/gpu/check_cupti.py [--cost] [--timeout 420]

Records one session with ``cupti=True`` in which PyTorch makes a 256 MiB segment, a raw ``cudaMalloc``
of 512 MiB (ctypes on the libcudart torch loaded) is held then freed, and CuPy's pool takes 64 MiB;
then loads the trace and checks: records per kind/op, the raw allocation's bytes and the innermost
frame of its Python stack (``raw_cudamalloc`` here), PyTorch's segment recognised and not counted as
non-PyTorch, the report's breakdown at the peak. ``--cost`` also times 200 uncached allocations
(``empty_cache`` between them) without memtrace, with memtrace, and with memtrace and CUPTI.
Prints one JSON line, then PASS or FAIL with the reasons; exit code 0 (pass), 1 (fail), 3 (timeout
or crash).
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import glob
import json
import os
import signal
import sys
import tempfile
import time
import traceback

from memtrace.analysis.memory.curves import all_curves

MiB = 1 << 20
TORCH_BYTES = 256 * MiB
RAW_BYTES = 512 * MiB
CUPY_BYTES = 64 * MiB
figures: dict = {}


def _bail(reason: str, code: int = 3) -> None:
    figures["error"] = reason
    print(json.dumps(figures, default=str), flush=True)
    print(f"FAIL: {reason}", flush=True)
    os._exit(code)


def find_cudart() -> str:
    """The libcudart this process already loaded (torch's), else one from the nvidia/torch wheels."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "libcudart.so" in os.path.basename(path):
                    return path
    except OSError:
        pass
    for base in sys.path:
        for pattern in (
            "nvidia/cu13/lib/libcudart.so*",
            "nvidia/cuda_runtime/lib/libcudart.so*",
            "torch/lib/libcudart*.so*",
        ):
            hits = sorted(glob.glob(os.path.join(base, pattern)))
            if hits:
                return hits[0]
    return "libcudart.so"


def raw_cudamalloc(cudart, nbytes: int) -> int:
    """A kernel library's own cudaMalloc, outside PyTorch's allocator (its frame must be the stack's innermost)."""
    ptr = ctypes.c_void_p()
    rc = cudart.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes))
    if rc != 0:
        raise RuntimeError(f"cudaMalloc returned {rc}")
    return int(ptr.value)


def time_uncached(torch, n: int = 200) -> float:
    """Seconds for ``n`` allocations that each reach cudaMalloc (empty_cache between them)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    t0 = time.perf_counter()
    for _ in range(n):
        x = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        del x
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _cost(torch, memtrace, label: str, cupti: bool | None, d: str) -> None:
    if cupti is None:
        figures[f"cost_{label}_s"] = round(time_uncached(torch), 4)
        return
    from memtrace.store import load_trace

    with memtrace.trace(os.path.join(d, f"cost-{label}.memtrace"), cupti=cupti, sidecar=False) as session:
        figures[f"cost_{label}_s"] = round(time_uncached(torch), 4)
    figures[f"cost_{label}_records"] = len(load_trace(session.path).device_allocs)


def record(torch, memtrace, cudart, d: str):
    path = os.path.join(d, "check.memtrace")
    with memtrace.trace(path, cupti=True) as session:
        time.sleep(1.0)  # the NVML sidecar starts without being waited for
        with memtrace.phase("torch_segment"):
            x = torch.empty(TORCH_BYTES, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
        with memtrace.phase("cupy_pool"):
            try:
                import cupy

                y = cupy.empty(CUPY_BYTES, dtype=cupy.uint8)
                cupy.cuda.runtime.deviceSynchronize()
                figures["cupy"] = cupy.__version__
            except Exception as exc:  # noqa: BLE001  (cupy is optional for the check)
                y = None
                figures["cupy"] = f"unavailable: {exc!r}"
        with memtrace.phase("raw_cudamalloc"):
            ptr = raw_cudamalloc(cudart, RAW_BYTES)
            time.sleep(0.3)  # held: NVML sees it
            figures["raw_address"] = hex(ptr)
        with memtrace.phase("raw_free"):
            cudart.cudaFree(ctypes.c_void_p(ptr))
            time.sleep(0.2)
        with memtrace.phase("torch_ops"):  # first cuDNN / cuBLAS use: their handles' own memory, if any
            a = torch.randn(8, 16, 32, 32, device="cuda")
            w = torch.randn(16, 16, 3, 3, device="cuda")
            torch.ops.aten.convolution(a, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
            m = torch.randn(1024, 1024, device="cuda")
            torch.ops.aten.mm(m, m)
            torch.cuda.synchronize()
        figures["cupti_fact_live"] = dict(session.facts.get("cupti") or {})
        del x, y
    return path


def counts(trace) -> dict[str, int]:
    """Records per ``kind/op`` ("device/allocation": 12...)."""
    from memtrace.model import MEMORY_KINDS, MEMORY_OPS

    out: dict[str, int] = {}
    for k, o in zip(trace.device_allocs["kind"].tolist(), trace.device_allocs["op"].tolist(), strict=True):
        key = (
            f"{MEMORY_KINDS[k] if 0 <= k < len(MEMORY_KINDS) else k}/{MEMORY_OPS[o] if 0 <= o < len(MEMORY_OPS) else o}"
        )
        out[key] = out.get(key, 0) + 1
    return out


def check(trace) -> list[str]:
    from memtrace.analysis.analysed.run import analyse
    from memtrace.analysis.memory import non_torch
    from memtrace.analysis.memory.phases import path_at

    recs = trace.device_allocs
    figures["records"] = len(recs)
    figures["per_kind_op"] = counts(trace)
    figures["cupti_fact"] = trace.facts.get("cupti")
    failures = []
    alloc, release = non_torch.MEMORY_OPS.index("allocation"), non_torch.MEMORY_OPS.index("release")
    raw = [i for i in range(len(recs)) if recs["bytes"][i] == RAW_BYTES and recs["op"][i] == alloc]
    raw_free = [i for i in range(len(recs)) if recs["bytes"][i] == RAW_BYTES and recs["op"][i] == release]
    if not raw:
        failures.append("no record of the raw 512 MiB cudaMalloc")
    else:
        i = raw[-1]
        frames = trace.stack_frames(int(recs["stack"][i]))
        inner = frames[0] if frames else None
        figures["raw_bytes"] = int(recs["bytes"][i])
        figures["raw_innermost_frame"] = f"{inner.filename}:{inner.line} {inner.name}" if inner else None
        figures["raw_phase"] = path_at(trace, int(recs["time_us"][i]))
        figures["raw_released"] = bool(raw_free)
        if inner is None or inner.name != "raw_cudamalloc":
            failures.append(f"the raw cudaMalloc's innermost frame is {figures['raw_innermost_frame']!r}")
        if figures["raw_phase"] != "raw_cudamalloc":
            failures.append(f"the raw cudaMalloc is in phase {figures['raw_phase']!r}")
        if not raw_free:
            failures.append("no release record of the raw cudaMalloc")
    torch_flags = non_torch.torch_made(trace)
    seg = [i for i in range(len(recs)) if recs["bytes"][i] == TORCH_BYTES and recs["op"][i] == alloc]
    figures["torch_segment_recognised"] = bool(seg) and all(bool(torch_flags[i]) for i in seg)
    if not figures["torch_segment_recognised"]:
        failures.append("PyTorch's 256 MiB segment was not recognised")
    cupy_seen = any(recs["bytes"][i] == CUPY_BYTES and recs["op"][i] == alloc for i in range(len(recs)))
    figures["cupy_seen"] = cupy_seen
    if not str(figures.get("cupy", "")).startswith("unavailable") and not cupy_seen:
        failures.append("no record of CuPy's 64 MiB pool allocation")
    fact = trace.facts.get("cupti") or {}
    if not fact.get("on") or not isinstance(fact.get("started_us"), int):
        failures.append(f"facts['cupti'] lacks on/started_us: {fact}")
    figures["cupti_own_bytes"] = non_torch.cupti_own_bytes(trace, all_curves(trace))
    ops_phase = next((p for p in trace.phases if p.name == "torch_ops"), None)
    if ops_phase is not None:  # what the operators' libraries allocated themselves (reported, not checked)
        seen = []
        for i in range(len(recs)):
            t = int(recs["time_us"][i])
            if torch_flags[i] or recs["op"][i] != alloc or not ops_phase.start_us <= t <= ops_phase.end_us:
                continue
            frames = trace.stack_frames(int(recs["stack"][i]))
            kind = non_torch.MEMORY_KINDS[int(recs["kind"][i])]
            seen.append({"bytes": int(recs["bytes"][i]), "kind": kind, "ops": [f.op for f in frames if f.op],
                         "category": non_torch.classify(frames, "torch_ops", kind)})  # fmt: skip
        figures["torch_ops_records"] = seen
    summary = analyse([trace]).ranks[0]
    figures["breakdown"] = [_plain(b) for b in summary.non_torch_moments]
    peak = next((b for b in summary.non_torch_moments if b.moment == "peak"), None)
    if peak is None:
        failures.append("the report has no non-PyTorch breakdown")
    else:
        if peak.torch_bytes < TORCH_BYTES:
            failures.append(f"PyTorch bytes at the peak {peak.torch_bytes} < the 256 MiB segment")
        if peak.cupti_bytes >= TORCH_BYTES + RAW_BYTES:
            failures.append("PyTorch's segment is counted as non-PyTorch too")
    if raw:
        held = non_torch.breakdown(trace, int(recs["time_us"][raw[-1]]), "raw held", curves=all_curves(trace))
        figures["breakdown_raw_held"] = _plain(held)
        if held.cupti_bytes < RAW_BYTES or held.cupti_bytes >= RAW_BYTES + TORCH_BYTES:
            failures.append(f"non-PyTorch bytes while the raw cudaMalloc is held: {held.cupti_bytes}")
    return failures


def _plain(b) -> dict:
    return {
        "moment": b.moment,
        "phase": b.phase_path,
        "cupti_bytes": b.cupti_bytes,
        "torch_bytes": b.torch_bytes,
        "nvml_non_torch_bytes": b.nvml_non_torch_bytes,
        "unexplained_bytes": b.unexplained_bytes,
        "at_start_bytes": b.at_start_bytes,
        "cupti_own_bytes": b.cupti_own_bytes,
        "grew_unseen_bytes": b.grew_unseen_bytes,
        "categories": {c.name: c.bytes for c in b.categories},
        "libraries": {c.name: dict(c.libraries) for c in b.categories if c.libraries},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cost", action="store_true", help="also time 200 uncached allocations off/on")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds before giving up (exit 3)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGALRM, lambda *_: _bail(f"timed out after {args.timeout:.0f} s"))
    signal.alarm(int(args.timeout))
    faulthandler.dump_traceback_later(args.timeout + 30, exit=True)  # stuck in C with the GIL held
    try:
        from cupti import cupti  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        _bail(f"cupti-python not importable: {exc!r}")
    try:
        import memtrace
        import torch
        from memtrace.store import load_trace

        torch.cuda.init()
        torch.empty(1, device="cuda")  # the CUDA context exists first, as in a vLLM worker
        path = find_cudart()
        figures["cudart"] = path
        cudart = ctypes.CDLL(path)
        figures["torch"] = torch.__version__
        with tempfile.TemporaryDirectory() as d:
            if args.cost:
                _cost(torch, memtrace, "none", None, d)
                _cost(torch, memtrace, "memtrace", False, d)
            trace_path = record(torch, memtrace, cudart, d)
            trace = load_trace(trace_path)
            if os.environ.get("OUT"):  # bring the trace back (the device tool's $OUT)
                import shutil

                shutil.copy(trace_path, os.path.join(os.environ["OUT"], "check-cupti.memtrace"))
            if args.cost:
                _cost(torch, memtrace, "memtrace_cupti", True, d)  # with stacks when MEMTRACE_CUPTI_STACKS=1
                stacks_env = os.environ.pop("MEMTRACE_CUPTI_STACKS", None)
                _cost(torch, memtrace, "memtrace_cupti_records_only", True, d)
                if stacks_env is not None:
                    os.environ["MEMTRACE_CUPTI_STACKS"] = stacks_env
        failures = check(trace)
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        _bail(f"crashed: {exc!r}")
    if args.cost:
        base = figures.get("cost_memtrace_s") or 0
        figures["cost_cupti_extra_us_per_alloc"] = round((figures["cost_memtrace_cupti_s"] - base) / 200 * 1e6, 1)
        if figures["cost_memtrace_cupti_records"] < 400:  # 200 cudaMalloc + 200 cudaFree
            failures.append(f"the cost run with CUPTI saw {figures['cost_memtrace_cupti_records']} records, not 400")
    signal.alarm(0)
    faulthandler.cancel_dump_traceback_later()
    print(json.dumps(figures, default=str), flush=True)
    print("PASS" if not failures else "FAIL: " + "; ".join(failures), flush=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
