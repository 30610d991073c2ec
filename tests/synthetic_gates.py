"""SYNTHETIC vLLM-like start-ups (the vLLM plugin's canonical phase names) with knobs, for the gate commands' tests (diff, fits, issue, export).

Not a recording: built with ``tests/synthetic_startup.py``'s Builder so that every figure is known
in advance, and sized the way vLLM 0.25 sizes its KV cache (``available = int(util × capacity) −
non_kv``, non_kv = the pre-KV peak of reserved + non-PyTorch memory), which is written to the facts
as vLLM's own figure. Real H200 traces under ``tests/data/h200`` are preferred where they exist.
Load by path (tests run with ``--import-mode=importlib``): see :func:`load_module`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def load_module(name: str):
    """Import ``tests/<name>.py`` by path (once)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TESTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


_s = load_module("synthetic_startup")
GiB, MiB = _s.GiB, _s.MiB
HOOK = _s.HOOK
EXTRA_WORKSPACE = _s.MOE + [(_s.SITE + "my_patch/workspace.py", 17, "allocate_extra_workspace")]
CONTEXT = 600 * MiB  # CUDA context etc.; the Builder adds 300 MiB of non-PyTorch memory after 2 s
NON_TORCH = CONTEXT + 300 * MiB


def vllm_like_startup(
    *,
    capacity: int = 48 * GiB,
    util: float = 0.92,
    weights: int = 20 * GiB,
    workspace: int = 2 * GiB,
    extra_workspace: int = 0,
    activation: int = 6 * GiB,
    warmup: int = 2 * GiB,
    graph_pool: int = 512 * MiB,
    oom_in: str | None = None,
    kv_cache: int | None = None,
):
    """A SYNTHETIC start-up: weights, a FlashInfer workspace and an activation spike in profile_run,
    the KV cache sized like vLLM, a warm-up transient and a CUDA-graph pool.

    ``extra_workspace`` adds a second, persistent allocation inside the workspace hook call from its
    own stack (``allocate_extra_workspace``). ``oom_in`` ("profile_run") marks the run as died there.
    ``kv_cache`` fixes the KV cache size (as ``--kv-cache-memory`` does) instead of vLLM's sizing.
    """
    b = _s.Builder()
    try:
        return _build(
            b, capacity, util, weights, workspace, extra_workspace, activation, warmup, graph_pool, oom_in, kv_cache
        )
    except _Died:
        return _finish(b, capacity, util, None, oom=True)


class _Died(Exception):
    """The SYNTHETIC process died of OOM here."""


def _build(b, capacity, util, weights, workspace, extra_workspace, activation, warmup, graph_pool, oom_in, kv_cache):
    with b.phase("init_device"):
        b.tick(500_000)
        b.alloc(20 * MiB, _s.WORKER)
        b.tick(2_000_000)
    with b.phase("load_model"):
        for _ in range(weights // GiB):
            b.tick(100_000)
            b.alloc(GiB, _s.LOAD)
        b.tick(400_000)
    with b.phase("determine_available_memory"):
        b.tick(500_000)
        with b.phase("profile_run"):
            b.tick(500_000)
            start = b.t_us
            b.alloc(workspace, _s.WORKSPACE)
            b.tick(500)
            if extra_workspace:
                b.alloc(extra_workspace, EXTRA_WORKSPACE)
            b.tick(500)
            b.hooks.append(
                _s.HookCall(HOOK, start, b.t_us, {"routed_rows": 65536}, returned_bytes=workspace + extra_workspace)
            )
            b.tick(100_000)
            act = b.alloc(activation, _s.ACTIVATION)
            b.tick(30_000)
            if oom_in == "profile_run":
                raise _Died
            b.free(act)
            b.tick(500_000)
            b.empty_cache()
        b.tick(500_000)
    # vLLM's sizing: everything before the KV cache is card-independent
    non_kv = 20 * MiB + weights + workspace + extra_workspace + activation + NON_TORCH
    available = int(capacity * util) - non_kv if kv_cache is None else kv_cache
    with b.phase("kv_cache_init"):
        b.tick(50_000)
        b.alloc(available // (2 * MiB) * 2 * MiB, _s.KV)
        b.tick(50_000)
    b.tick(500_000)
    with b.phase("compile_or_warm_up"):
        b.tick(200_000)
        with b.phase("kernel_warmup"):
            w = b.alloc(warmup, _s.ACTIVATION)
            b.tick(20_000)
            b.free(w)
        b.tick(200_000)
        with b.phase("capture_model"):
            b.tick(500_000)
            b.alloc(graph_pool, _s.CAPTURE, pool="2,0")
            b.tick(500_000)
        b.tick(500_000)
    return _finish(b, capacity, util, available)


def _finish(b, capacity: int, util: float, available: int | None, oom: bool = False):
    trace = b.trace(capacity, util, context_bytes=CONTEXT, sample_every_us=5_000)
    trace.facts.update(
        {
            "env": {
                "gpu_name": "SYNTHETIC GPU",
                "compute_capability": "9.0",
                "driver": "580.0",
                "cuda": "13.0",
                "torch": "2.11.0",
                "vllm": "0.25.1",
                "flashinfer": "0.6.13",
                "cmdline": ["vllm", "serve", "synthetic/model", "--gpu-memory-utilization", str(util)],
            }
        }
    )
    if available is not None:
        trace.facts["vllm.available_kv_cache_bytes"] = available
    if oom:  # the process died inside the phases still open: they never ended
        trace.facts["oom"] = {"time_us": b.t_us, "device": 0, "requested_bytes": 2 * GiB}
        trace.recording.end_reason = "oom"
        for p in trace.phases:
            if p.end_us is not None and p.end_us >= b.t_us:
                p.end_us = None
    return trace
