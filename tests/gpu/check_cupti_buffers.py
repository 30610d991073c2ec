"""GPU check: how much device memory CUPTI itself takes, with its defaults and with memtrace's attributes.

On the H200 (2026-12-03) the vLLM start-up with CUPTI on had 12,582,912 B more non-PyTorch memory and a KV
cache smaller by exactly that (tests/data/vllm-h200/README.md). CUPTI pre-allocates device buffers for
GPU-written records on every context (``CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_PRE_ALLOCATE_VALUE``, 3 by
default); ``capture.cupti`` sets it (and the semaphore pools') to 0 since MEMORY2 records are made on
the host. Each mode runs in a fresh process: the context is made and warmed, NVML's figure for this
process is read, the mode starts, the same work runs (a 256 MiB PyTorch segment, a matmul, a raw 64 MiB
``cudaMalloc`` held), NVML is read again. Modes: ``none`` (no CUPTI), ``defaults`` (MEMORY2 enabled
with CUPTI's defaults), ``memtrace`` (``memtrace.start(cupti=True)``: memtrace's attributes).

    PYTHONPATH=/tmp/cupti:/tmp/mt python3 tests/gpu/check_cupti_buffers.py

Prints one JSON line per mode and a last line comparing them.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20


def nvml_used_by_me() -> int:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if p.pid == os.getpid():
            return int(p.usedGpuMemory)
    return -1


def child(mode: str) -> dict:
    import torch

    torch.cuda.init()
    torch.ones(1, device="cuda").sum().item()
    torch.cuda.synchronize()
    time.sleep(0.3)
    before = nvml_used_by_me()
    out: dict = {"mode": mode}
    session = api = None
    if mode == "defaults" or mode.startswith("attrs:"):
        from cupti import cupti as api

        for item in mode.removeprefix("attrs:").split(",") if mode.startswith("attrs:") else []:
            name, value = item.split("=")
            v, n = ctypes.c_size_t(int(value)), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
            old = ctypes.c_size_t(0)
            api.activity_get_attribute(
                int(getattr(api.ActivityAttribute, name)), ctypes.addressof(n), ctypes.addressof(old)
            )
            n = ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
            api.activity_set_attribute(
                int(getattr(api.ActivityAttribute, name)), ctypes.addressof(n), ctypes.addressof(v)
            )
            out.setdefault("defaults", {})[name] = int(old.value)
        rows: list = []
        api.activity_register_callbacks(lambda: (1 << 20, 0), lambda acts: rows.extend(int(a.bytes) for a in acts))
        api.activity_enable(api.ActivityKind.MEMORY2)
        out["rows"] = rows
    elif mode == "memtrace":
        import memtrace

        session = memtrace.start(os.path.join(tempfile.mkdtemp(), "t.memtrace"), cupti=True, sidecar=False)
    time.sleep(0.3)
    out["after_start_delta"] = nvml_used_by_me() - before
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    a = torch.randn(2048, 2048, device="cuda")
    (a @ a).sum().item()
    cudart = ctypes.CDLL(next(line.split()[-1] for line in open("/proc/self/maps") if "libcudart.so" in line))
    ptr = ctypes.c_void_p()
    assert cudart.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(64 * MiB)) == 0
    torch.cuda.synchronize()
    time.sleep(0.3)
    after = nvml_used_by_me()
    out["reserved"] = torch.cuda.memory_reserved()
    out["delta"] = after - before
    out["non_torch_delta"] = after - before - out["reserved"]
    if api is not None:
        api.activity_flush_all(1)
        out["records"] = len(out.pop("rows"))
    if session is not None:
        fact = dict(session.facts.get("cupti") or {})
        session.close()
        from memtrace.store import load_trace

        out["records"] = len(load_trace(session.path).device_allocs)
        out["attributes"] = fact.get("attributes")
        out["errors"] = fact.get("errors")
    cudart.cudaFree(ptr)
    del x
    return out


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])), flush=True)
        return 0
    results = {}
    for mode in ("none", "defaults", "memtrace", *sys.argv[1:]):
        p = subprocess.run([sys.executable, __file__, "--child", mode], capture_output=True, text=True, timeout=120)
        line = (p.stdout.strip().splitlines() or ["{}"])[-1]
        print(line if p.returncode == 0 else json.dumps({"mode": mode, "rc": p.returncode, "err": p.stderr[-800:]}))
        try:
            results[mode] = json.loads(line)
        except ValueError:
            results[mode] = {}
    none = results.get("none", {}).get("non_torch_delta")
    comparison = {
        m: (r.get("non_torch_delta") - none if none is not None and "non_torch_delta" in r else None)
        for m, r in results.items()
    }
    print(json.dumps({"cupti_own_bytes_vs_none": comparison}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
