"""SYNTHETIC traces shaped like a vLLM start-up, for tests and benchmarks of the renderers.

Not a recording: these are built by hand so that every figure is known in advance (a 48 GiB card,
a 0.92 target, a 30 ms transient peak in ``profile_run`` that crosses it, a FlashInfer workspace
hook call, a CUDA-graph pool). Real H200 traces live under ``tests/data`` and are preferred where
they exist. Load this module by path (tests run with ``--import-mode=importlib``)::

    spec = importlib.util.spec_from_file_location("synthetic_startup", TESTS / "synthetic_startup.py")
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from memtrace.model import (
    ACTION_CODE,
    EVENT_DTYPE,
    SAMPLE_DTYPE,
    Block,
    Frame,
    HookCall,
    Phase,
    Process,
    Recording,
    Segment,
    Trace,
)

GiB = 1024**3
MiB = 1024**2
T0 = 1_780_000_000_000_000  # Unix-epoch microseconds
SITE = "/usr/lib/python3.12/site-packages/"
# Dotted form. The vLLM plugin records ``module:qualname`` (hooks.Target.path); test_flame covers that form.
HOOK = "flashinfer.fused_moe.cute_dsl.blackwell_sm12x.moe_dispatch.allocate_sm120_dynamic_workspace"

# Stacks, outermost first here (the builder stores them innermost first, as PyTorch does).
WORKER = [(SITE + "vllm/v1/worker/worker_base.py", 320, "execute_method")]
LOAD = WORKER + [
    (SITE + "vllm/v1/worker/gpu_worker.py", 406, "load_model"),
    (SITE + "vllm/v1/worker/gpu_model_runner.py", 5204, "load_model"),
    (SITE + "vllm/model_executor/model_loader/base_loader.py", 56, "load_model"),
    (SITE + "vllm/model_executor/layers/linear.py", 301, "create_weights"),
]
PROFILE = WORKER + [
    (SITE + "vllm/v1/worker/gpu_worker.py", 430, "determine_available_memory"),
    (SITE + "vllm/v1/worker/gpu_model_runner.py", 6290, "profile_run"),
    (SITE + "vllm/model_executor/models/qwen3_moe.py", 288, "forward"),
]
MOE = PROFILE + [(SITE + "vllm/model_executor/layers/fused_moe/flashinfer_b12x.py", 97, "apply")]
WORKSPACE = MOE + [
    (SITE + "flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_dispatch.py", 212, "allocate_sm120_dynamic_workspace")
]
ACTIVATION = PROFILE + [(SITE + "vllm/model_executor/layers/activation.py", 120, "forward_cuda")]
KV = WORKER + [
    (SITE + "vllm/v1/worker/gpu_worker.py", 679, "initialize_from_config"),
    (SITE + "vllm/v1/worker/gpu_model_runner.py", 7405, "initialize_kv_cache"),
    (SITE + "vllm/v1/worker/gpu_model_runner.py", 7081, "_allocate_kv_cache_tensors"),
]
CAPTURE = WORKER + [
    (SITE + "vllm/v1/worker/gpu_worker.py", 520, "compile_or_warm_up_model"),
    (SITE + "vllm/v1/worker/gpu_model_runner.py", 6647, "capture_model"),
    (SITE + "torch/cuda/graphs.py", 77, "capture_begin"),
]


@dataclass
class Builder:
    """Appends allocator events with a caching-allocator-like segment model (one segment per block)."""

    t_us: int = T0
    events: list[tuple] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    stacks: list[tuple[int, ...]] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    hooks: list[HookCall] = field(default_factory=list)
    live: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # addr -> size, stack, pool
    cached: dict[int, tuple[int, str]] = field(default_factory=dict)  # segment addr -> size, pool (no live block)
    next_addr: int = 0x7F00_0000_0000
    _open: list[int] = field(default_factory=list)

    def stack(self, frames_outer_first: list[tuple[str, int, str]]) -> int:
        ids = []
        for f in reversed(frames_outer_first):
            fr = Frame(*f)
            if fr not in self.frames:
                self.frames.append(fr)
            ids.append(self.frames.index(fr))
        key = tuple(ids)
        if key not in self.stacks:
            self.stacks.append(key)
        return self.stacks.index(key)

    def tick(self, us: int) -> None:
        self.t_us += us

    def _event(self, action: str, addr: int, size: int, stack: int = -1) -> None:
        self.events.append((self.t_us, ACTION_CODE[action], addr, size, 0, stack))

    def alloc(self, size: int, frames, pool: str = "0,0") -> int:
        seg = -(-size // (2 * MiB)) * 2 * MiB
        reuse = [a for a, (s, p) in self.cached.items() if s == seg and p == pool]
        if reuse:  # the caching allocator hands out a cached segment: no cudaMalloc
            addr = reuse[0]
            del self.cached[addr]
        else:
            addr = self.next_addr
            self.next_addr += seg
            self._event("segment_alloc", addr, seg)
        self._event("alloc", addr, size, self.stack(frames))
        self.live[addr] = (size, self.stack(frames), pool)
        return addr

    def free(self, addr: int) -> None:
        size, _, pool = self.live.pop(addr)
        self._event("free_requested", addr, size)
        self._event("free_completed", addr, size)
        self.cached[addr] = (-(-size // (2 * MiB)) * 2 * MiB, pool)

    def empty_cache(self) -> None:
        for addr, (seg, _) in sorted(self.cached.items()):
            self._event("segment_free", addr, seg)
        self.cached.clear()

    @contextmanager
    def phase(self, name: str, source: str = "vllm"):
        parent = self._open[-1] if self._open else None
        self.phases.append(Phase(name, self.t_us, None, parent, source))
        self._open.append(len(self.phases) - 1)
        try:
            yield
        finally:
            self.phases[self._open.pop()].end_us = self.t_us

    def hook(self, name: str, sizes: list[int], frames, duration_us: int = 2000) -> list[int]:
        start = self.t_us
        addrs = []
        for s in sizes:
            self.tick(duration_us // (len(sizes) + 1))
            addrs.append(self.alloc(s, frames))
        self.t_us = start + duration_us
        self.hooks.append(HookCall(name, start, self.t_us, {"num_experts": 128}, returned_bytes=sum(sizes)))
        return addrs

    def trace(self, device_total: int, util: float, context_bytes: int, sample_every_us: int) -> Trace:
        events = np.array(self.events, dtype=EVENT_DTYPE)
        segments = [Segment(a, seg, pool_id=pool) for a, (seg, pool) in self.cached.items()]
        for addr, (size, stack, pool) in self.live.items():
            seg = -(-size // (2 * MiB)) * 2 * MiB
            segments.append(
                Segment(addr, seg, pool_id=pool, blocks=[Block(addr, seg, size, "active_allocated", stack)])
            )
        segments.sort(key=lambda s: s.address)
        end = self.t_us + 1000
        trace = Trace(
            process=Process(
                pid=4242, hostname="synthetic", role="worker", rank=0, device_index=0, device_total_bytes=device_total
            ),
            recording=Recording(start_us=T0, end_us=end, end_reason="startup-complete"),
            events=events,
            frames=self.frames,
            stacks=self.stacks,
            segments=segments,
            phases=self.phases,
            hook_calls=self.hooks,
            facts={"target_bytes": int(device_total * util), "gpu_memory_utilization": util, "synthetic": True},
        )
        # NVML sees reserved + CUDA context + a little non-torch growth after init_device.
        delta = np.where(np.isin(events["action"], (3, 5)), events["size"], 0) - np.where(
            np.isin(events["action"], (4, 6)), events["size"], 0
        )
        reserved = np.cumsum(delta)
        st = np.arange(T0, end, sample_every_us, dtype=np.int64)
        idx = np.searchsorted(events["time_us"], st, side="right") - 1
        res = np.where(idx >= 0, reserved[np.clip(idx, 0, None)], 0)
        samples = np.zeros(len(st), dtype=SAMPLE_DTYPE)
        samples["time_us"] = st
        samples["used_bytes"] = res + context_bytes + np.where(st > T0 + 2_000_000, 300 * MiB, 0)
        trace.samples = samples
        return trace


def synthetic_startup() -> Trace:
    """A 60 s SYNTHETIC vLLM-shaped start-up on a 48 GiB card at 0.92 (target 44.16 GiB), with the
    canonical vLLM phase names (``memtrace.vllm_phase_names``).

    Known figures: 24 GiB of weights (96 x 256 MiB) in load_model; a 4 GiB FlashInfer workspace
    (hook call at 13.0 s); a 14 GiB activation live for 30 ms from 18.0 s in profile_run, whose
    segment (reserved) stays above the target for 35 ms; 14 GiB of KV cache; 512 MiB of CUDA-graph pool in capture_model.
    """
    b = Builder()
    with b.phase("init_device"):
        b.tick(500_000)
        b.alloc(20 * MiB, WORKER)
        b.tick(1_500_000)
    with b.phase("load_model"):
        for _ in range(96):
            b.tick(100_000)
            b.alloc(256 * MiB, LOAD)
        b.tick(400_000)
    with b.phase("determine_available_memory"):
        b.tick(500_000)
        with b.phase("profile_run"):
            b.tick(500_000)
            b.hook(HOOK, [3 * GiB, 1 * GiB], WORKSPACE)
            acts = []
            for _ in range(40):
                b.tick(100_000)
                acts.append(b.alloc(64 * MiB, ACTIVATION))
            for a in acts:
                b.free(a)
            b.t_us = T0 + 18_000_000
            big = b.alloc(14 * GiB, MOE)
            b.tick(30_000)
            b.free(big)
            b.tick(5_000)
            b.empty_cache()  # vLLM's memory_profiling empties the cache: the excursion lasts 35 ms
            b.tick(1_965_000)
        with b.phase("cudagraph_profile"):  # vLLM's CUDA-graph estimate: a minimal KV cache + sample captures
            b.tick(200_000)
            mini = b.alloc(512 * MiB, KV)
            b.tick(300_000)
            g = b.alloc(300 * MiB, CAPTURE, pool="1,0")
            b.tick(3_000_000)
            b.free(g)
            b.free(mini)
            b.empty_cache()
        b.tick(1_000_000)
    with b.phase("kv_cache_init"):
        b.tick(100_000)
        for _ in range(28):
            b.tick(50_000)
            b.alloc(512 * MiB, KV)
        b.tick(1_900_000)
    with b.phase("compile_or_warm_up"):
        for _ in range(50):
            b.tick(200_000)
            a = b.alloc(1 * GiB, ACTIVATION)
            b.tick(10_000)
            b.free(a)
        b.t_us = T0 + 45_000_000
        with b.phase("capture_model"):
            for _ in range(8):
                b.tick(1_500_000)
                b.alloc(64 * MiB, CAPTURE, pool="2,0")
            b.tick(500_000)
        b.tick(1_000_000)
    return b.trace(48 * GiB, 0.92, context_bytes=550 * MiB, sample_every_us=5_000)


def synthetic_large(n_events: int = 1_000_000, seed: int = 0, n_stacks: int = 1) -> Trace:
    """A SYNTHETIC trace of about ``n_events`` events (300 s, alloc/free churn over 64 live slots)
    on top of 24 GiB of weights, with the same phase names and hook call as synthetic_startup.
    ``n_stacks`` > 1 spreads the churn over that many distinct 40-frame stacks (a wide flame graph).
    """
    rng = np.random.default_rng(seed)
    b = Builder()
    load_stack = b.stack(LOAD)
    act_stack = b.stack(ACTIVATION)
    n_steps = max(1, (n_events - 200) // 2)
    slots = 64
    sizes = rng.integers(4096, 64 * MiB, n_steps)
    ev = np.zeros(2 * n_steps + 2 * 96, dtype=EVENT_DTYPE)
    # weights: 96 segment_alloc + alloc pairs at 1..11 s
    w = np.arange(96)
    base = 0x7F00_0000_0000
    ev["time_us"][0:192:2] = ev["time_us"][1:192:2] = T0 + 1_000_000 + w * 100_000
    ev["action"][0:192:2], ev["action"][1:192:2] = ACTION_CODE["segment_alloc"], ACTION_CODE["alloc"]
    ev["addr"][0:192:2] = ev["addr"][1:192:2] = base + w * 256 * MiB
    ev["size"][0:192:2] = ev["size"][1:192:2] = 256 * MiB
    ev["stack"][0:192] = -1
    ev["stack"][1:192:2] = load_stack
    # churn: step i frees slot i % 64 (if used) then allocates into it; all inside one reserved pool
    pool = base + 96 * 256 * MiB
    rest = ev[192:]
    times = np.linspace(T0 + 12_000_000, T0 + 299_000_000, n_steps).astype(np.int64)
    slot_addr = pool + (np.arange(n_steps) % slots) * 64 * MiB
    rest["time_us"][0::2] = rest["time_us"][1::2] = times
    rest["action"][0::2] = ACTION_CODE["free_completed"]
    rest["action"][1::2] = ACTION_CODE["alloc"]
    rest["addr"][0::2] = rest["addr"][1::2] = slot_addr
    prev = np.concatenate((np.zeros(slots, dtype=np.int64), sizes[:-slots]))[:n_steps]
    rest["size"][0::2] = prev
    rest["size"][1::2] = sizes
    rest["stack"][0::2] = -1
    rest["stack"][1::2] = act_stack
    if n_stacks > 1:
        slots = 64 * max(1, n_stacks // 64)  # enough live slots that many stacks are live at once
        base_ids = b.stacks[act_stack]
        deep = [Frame(SITE + f"vllm/model_executor/layers/deep_{d}.py", 10 + d, f"call_{d}") for d in range(30)]
        first = len(b.frames)
        b.frames.extend(deep)
        for k in range(n_stacks):
            b.frames.append(Frame(SITE + f"vllm/model_executor/layers/op_{k % 97}.py", k, f"kernel_{k}"))
            b.stacks.append((len(b.frames) - 1, *range(first + 29, first - 1, -1), *base_ids))
        rest["stack"][1::2] = act_stack + 1 + (np.arange(n_steps) % n_stacks)
        slot_addr = pool + (np.arange(n_steps) % slots) * 64 * MiB
        rest["addr"][0::2] = rest["addr"][1::2] = slot_addr
        prev = np.concatenate((np.zeros(slots, dtype=np.int64), sizes[:-slots]))[:n_steps]
        rest["size"][0::2] = prev
    ev = ev[~((ev["action"] == ACTION_CODE["free_completed"]) & (ev["size"] == 0))]
    pool_seg = np.zeros(1, dtype=EVENT_DTYPE)
    pool_seg[0] = (T0 + 11_900_000, ACTION_CODE["segment_alloc"], pool, slots * 64 * MiB, 0, -1)
    ev = np.concatenate((ev[:192], pool_seg, ev[192:]))
    b.phases = [
        Phase("init_device", T0, T0 + 1_000_000, None, "vllm"),
        Phase("load_model", T0 + 1_000_000, T0 + 11_000_000, None, "vllm"),
        Phase("determine_available_memory", T0 + 11_000_000, T0 + 150_000_000, None, "vllm"),
        Phase("profile_run", T0 + 12_000_000, T0 + 140_000_000, 2, "vllm"),
        Phase("compile_or_warm_up", T0 + 150_000_000, T0 + 300_000_000, None, "vllm"),
        Phase("capture_model", T0 + 250_000_000, T0 + 299_500_000, 4, "vllm"),
    ]
    b.hooks = [HookCall(HOOK, T0 + 13_000_000, T0 + 13_002_000, {})]
    trace = Trace(
        process=Process(pid=1, rank=0, role="worker", device_total_bytes=48 * GiB),
        recording=Recording(start_us=T0, end_us=T0 + 300_000_000),
        events=ev,
        frames=b.frames,
        stacks=b.stacks,
        phases=b.phases,
        hook_calls=b.hooks,
        facts={"target_bytes": int(48 * GiB * 0.92), "synthetic": True},
    )
    st = np.arange(T0, T0 + 300_000_000, 10_000, dtype=np.int64)
    samples = np.zeros(len(st), dtype=SAMPLE_DTYPE)
    samples["time_us"] = st
    samples["used_bytes"] = np.where(st > T0 + 11_900_000, (96 * 256 + slots * 64) * MiB, 24 * GiB) + 600 * MiB
    trace.samples = samples
    return trace
