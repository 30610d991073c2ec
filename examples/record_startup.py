"""A vLLM-shaped start-up in plain PyTorch, recorded with memtrace: the real-GPU test bed.

It walks the phases vLLM's GPU worker walks, under vLLM's own phase names, on a small
transformer-MoE built from random bf16 weights (no download, no vLLM needed):

- ``init_device``: CUDA context, a cuBLAS warm-up, the "init snapshot" (free memory); with
  ``--capacity`` it mimics a smaller card with ``torch.cuda.set_per_process_memory_fraction``.
- ``load_model``: a few GiB of bf16 weights (attention + 16-expert MoE per layer, embeddings).
- ``profile_run``: one forward pass at ``--max-num-batched-tokens`` (a large transient activation
  peak in the dense expert dispatch) plus a FlashInfer-workspace-like buffer made by
  :func:`allocate_sm120_dynamic_workspace`. That function is an honest stand-in named after
  FlashInfer's b12x MoE allocator (``flashinfer.fused_moe.cute_dsl.blackwell_sm12x.moe_dispatch``)
  so memtrace's hooks and reports treat it the same way; it is cached per tactic, as FlashInfer's is.
- ``determine_available_memory``: vLLM's arithmetic: ``requested = ceil(util × capacity)``,
  ``non_kv = (free_at_init − free_after_profile) + (torch_peak − torch_allocated)`` (the init
  snapshot is taken after the CUDA context and cuBLAS warm-up, before the weights),
  ``available_kv = requested − non_kv`` (vLLM also subtracts a CUDA-graph estimate; this example
  applies none, like ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0``).
- ``kv_cache_init``: one KV tensor per layer, ``available_kv`` bytes in all.
- ``compile_or_warm_up`` with ``kernel_warmup`` (an "autotune" pass that allocates a second, persistent
  workspace tactic, as FlashInfer's autotuner did after profiling in vllm#49115, then a forward at
  max tokens) and ``capture_model`` (real CUDA-graph captures of the forward, largest batch first, in
  one private pool).

At each phase end torch's counters (max_memory_reserved, max_memory_allocated, memory_reserved,
memory_allocated) and NVML's device-used bytes go to ``facts[K.TORCH_COUNTERS]`` and to
``<trace>.counters.json`` next to the trace, with the outcome (``ok`` or the phase it died in).

Usage::

    python examples/record_startup.py --out runs/full
    python examples/record_startup.py --capacity 16GiB --out runs/16g     # dies after KV sizing
    python examples/record_startup.py --workspace-extra 1GiB --out runs/ws  # for memtrace diff
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import memtrace
import torch
import torch.nn.functional as F
from memtrace import facts as K
from memtrace.capture.api import current_session

UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_bytes(text: str) -> int:
    """``16GiB``, ``512MiB``, ``1e9`` or a plain integer of bytes."""
    m = re.fullmatch(r"\s*([0-9.e+]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write e.g. 16GiB, 512MiB or 1073741824")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


# -- a FlashInfer-workspace-like allocator (stand-in) ---------------------------------------------
@dataclass
class DynamicWorkspace:
    data: torch.Tensor
    row_index: torch.Tensor
    row_scale: torch.Tensor


_WORKSPACES: dict[tuple, DynamicWorkspace] = {}


def allocate_sm120_dynamic_workspace(
    *, routed_rows: int, k: int, tactic: int, extra_bytes: int, device
) -> DynamicWorkspace:
    """Stand-in for FlashInfer's b12x ``allocate_sm120_dynamic_workspace``: scratch for routed rows."""
    nbytes = routed_rows * k * 32 // (1 + tactic) + extra_bytes
    return DynamicWorkspace(
        data=torch.empty(nbytes, dtype=torch.uint8, device=device),
        row_index=torch.empty(routed_rows, dtype=torch.int32, device=device),
        row_scale=torch.empty(routed_rows, dtype=torch.float32, device=device),
    )


def get_cached_workspace(routed_rows: int, k: int, tactic: int, extra_bytes: int, device) -> DynamicWorkspace:
    """FlashInfer-style cache: a workspace per tactic, grown (never shrunk) to the largest request."""
    ws = _WORKSPACES.get((tactic,))
    if ws is None or ws.row_index.numel() < routed_rows:
        ws = allocate_sm120_dynamic_workspace(
            routed_rows=routed_rows, k=k, tactic=tactic, extra_bytes=extra_bytes, device=device
        )
        _WORKSPACES[(tactic,)] = ws
    return ws


# -- the model --------------------------------------------------------------------------------
class Layer(torch.nn.Module):
    def __init__(self, h: int, heads: int, inter: int, experts: int, topk: int, dev, dt):
        super().__init__()
        self.heads, self.topk = heads, topk
        self.norm = torch.nn.Parameter(torch.ones(h, device=dev, dtype=dt))
        self.qkv = torch.nn.Parameter(torch.randn(h, 3 * h, device=dev, dtype=dt) * h**-0.5)
        self.o = torch.nn.Parameter(torch.randn(h, h, device=dev, dtype=dt) * h**-0.5)
        self.router = torch.nn.Parameter(torch.randn(h, experts, device=dev, dtype=dt) * h**-0.5)
        self.w13 = torch.nn.Parameter(torch.randn(experts, h, 2 * inter, device=dev, dtype=dt) * h**-0.5)
        self.w2 = torch.nn.Parameter(torch.randn(experts, inter, h, device=dev, dtype=dt) * inter**-0.5)

    def forward(self, x: torch.Tensor, ws: DynamicWorkspace | None) -> torch.Tensor:
        t, h = x.shape
        y = F.rms_norm(x, (h,), self.norm)
        q, k, v = (y @ self.qkv).view(t, 3, self.heads, h // self.heads).permute(1, 2, 0, 3)
        a = F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=True)
        x = x + a.squeeze(0).permute(1, 0, 2).reshape(t, h) @ self.o
        y = F.rms_norm(x, (h,), self.norm)
        weights, idx = torch.topk(torch.softmax((y @ self.router).float(), dim=-1), self.topk, dim=-1)
        gate = torch.zeros(t, self.w13.shape[0], device=x.device, dtype=x.dtype).scatter_(1, idx, weights.to(x.dtype))
        if ws is not None:  # the kernel would use its workspace; touch it so it is really used
            ws.row_index[: t * self.topk].zero_()
        up = torch.einsum("th,ehi->eti", y, self.w13)  # dense dispatch: the big transient
        g, u = up.chunk(2, dim=-1)
        down = torch.einsum("eti,eih->eth", F.silu(g) * u, self.w2)
        return x + torch.einsum("eth,te->th", down, gate)


class Model(torch.nn.Module):
    def __init__(self, a, dev):
        super().__init__()
        dt = torch.bfloat16
        self.embed = torch.nn.Parameter(torch.randn(a.vocab, a.hidden, device=dev, dtype=dt))
        self.layers = torch.nn.ModuleList(
            Layer(a.hidden, a.heads, a.intermediate, a.experts, a.topk, dev, dt) for _ in range(a.layers)
        )
        self.lm_head = torch.nn.Parameter(torch.randn(a.hidden, a.vocab, device=dev, dtype=dt) * a.hidden**-0.5)
        self.topk, self.args = a.topk, a

    def forward(self, tokens: torch.Tensor, *, workspace_tactic: int | None = 0, num_logits: int = 256) -> torch.Tensor:
        x = self.embed[tokens]
        ws = None
        if workspace_tactic is not None:
            ws = get_cached_workspace(
                tokens.numel() * self.topk, x.shape[1], workspace_tactic, self.args.workspace_extra, x.device
            )
        for layer in self.layers:
            x = layer(x, ws)
        return (x[-num_logits:] @ self.lm_head).float()  # the sampler's logits


# -- counters ---------------------------------------------------------------------------------
class Counters:
    def __init__(self, path: Path, device: int):
        self.path, self.device, self.rows = path, device, []
        self.doc: dict = {"counters": self.rows}
        self._nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else "GPU-" + uuid))
        except Exception as exc:
            print(f"record_startup: no NVML counters ({exc})", file=sys.stderr)

    def nvml_used(self) -> int | None:
        if self._nvml is None:
            return None
        pynvml, handle = self._nvml
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)

    def take(self, phase: str) -> dict:
        torch.cuda.synchronize(self.device)
        row = {
            "phase": phase,
            "time_us": time.time_ns() // 1000,
            "max_memory_reserved": torch.cuda.max_memory_reserved(self.device),
            "max_memory_allocated": torch.cuda.max_memory_allocated(self.device),
            "memory_reserved": torch.cuda.memory_reserved(self.device),
            "memory_allocated": torch.cuda.memory_allocated(self.device),
            "nvml_used": self.nvml_used(),
        }
        self.rows.append(row)
        self.save()
        return row

    def save(self) -> None:
        session = current_session()
        if session is not None:
            session.set_fact(K.TORCH_COUNTERS, self.rows)
        self.path.write_text(json.dumps(self.doc, indent=1, sort_keys=True))


@contextmanager
def vphase(name: str, counters: Counters):
    """A vLLM phase: memtrace.phase plus torch's counters at its end (even when it dies)."""
    try:
        with memtrace.phase(name, source="vllm"):
            try:
                yield
            except BaseException:
                session = current_session()
                if session is not None and K.DIED_IN not in session.facts:
                    session.set_fact(K.DIED_IN, session.phase_path())
                raise
    finally:
        counters.take(name)


# -- the start-up -----------------------------------------------------------------------------
def startup(a, session) -> dict:
    dev = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(dev).total_memory
    capacity = a.capacity or total
    counters = Counters(session.path.with_suffix(".counters.json"), dev.index)
    counters.doc.update(capacity_bytes=capacity, device_total_bytes=total, util=a.util, argv=sys.argv[1:])
    session.set_fact(K.UTIL, a.util)
    session.set_fact(K.TARGET_BYTES, math.ceil(a.util * capacity))
    session.set_fact(K.CAPACITY_BYTES, capacity)
    counters.doc["target_bytes"] = math.ceil(a.util * capacity)

    numbers: dict = {}
    counters.doc["vllm"] = numbers

    def note(**kv) -> None:  # vLLM's own figures: facts "vllm.<name>" and the counters JSON
        numbers.update(kv)
        for key, value in kv.items():
            session.set_fact(f"vllm.{key}", value)

    def free_on_card() -> int:  # free memory of the (mimicked) card: capacity - device used
        free, tot = torch.cuda.mem_get_info(dev)
        return capacity - (tot - free)

    with vphase("init_device", counters):
        torch.cuda.set_device(dev)
        x = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
        (x @ x).sum().item()  # cuBLAS warm-up, as vLLM does
        del x
        non_torch = (total - torch.cuda.mem_get_info(dev)[0]) - torch.cuda.memory_reserved(dev)
        if a.capacity:
            fraction = min(1.0, max(0.0, (capacity - non_torch) / total))
            torch.cuda.set_per_process_memory_fraction(fraction, dev)
            session.set_fact(K.MEMORY_FRACTION, fraction)
        requested = math.ceil(a.util * capacity)
        free_init = free_on_card()  # vLLM's init snapshot: after the context and cuBLAS, before weights
        note(requested_memory_bytes=requested, non_torch_at_init_bytes=non_torch, init_free_bytes=free_init)

    with vphase("load_model", counters):
        model = Model(a, dev)
        torch.cuda.synchronize(dev)

    max_tokens = a.max_num_batched_tokens
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    session.set_fact(K.PEAK_STATS_RESET_US, time.time_ns() // 1000)
    with vphase("profile_run", counters), torch.inference_mode():
        tokens = torch.randint(0, a.vocab, (max_tokens,), device=dev)
        model(tokens)
        del tokens
        torch.cuda.synchronize(dev)

    with vphase("determine_available_memory", counters):
        gc.collect()
        torch.cuda.empty_cache()
        free_after = free_on_card()
        peak = torch.cuda.max_memory_allocated(dev)
        allocated = torch.cuda.memory_allocated(dev)
        non_kv = (free_init - free_after) + (peak - allocated)
        available_kv = requested - non_kv
        note(non_kv_cache_memory_bytes=non_kv, available_kv_cache_bytes=available_kv)
        note(profile_torch_peak_bytes=peak, torch_allocated_after_profile_bytes=allocated)
        if available_kv <= 0:
            raise ValueError(
                f"No available memory for the cache blocks: requested {requested} B, non-KV {non_kv} B; "
                "try increasing --util"
            )

    with vphase("kv_cache_init", counters):
        per_layer = available_kv // a.layers
        block = 2 * a.hidden * 2 * 16  # K and V, bf16, 16-token blocks
        blocks = max(per_layer // block, 1)
        kv = [torch.empty(blocks * block, dtype=torch.uint8, device=dev) for _ in range(a.layers)]
        note(kv_cache_tokens=blocks * 16, kv_cache_bytes=blocks * block * a.layers)

    graphs = {}
    with vphase("compile_or_warm_up", counters), torch.inference_mode():
        with vphase("kernel_warmup", counters):
            # "autotune": another tactic gets its own persistent workspace, after the KV cache is sized
            get_cached_workspace(max_tokens * a.topk, a.hidden, 1, a.autotune_extra, dev)
            model(torch.randint(0, a.vocab, (max_tokens,), device=dev), workspace_tactic=1)
            torch.cuda.synchronize(dev)
        with vphase("capture_model", counters):
            pool = torch.cuda.graph_pool_handle()
            for bs in sorted(a.capture_sizes, reverse=True):
                static = torch.zeros(bs, dtype=torch.long, device=dev)
                s = torch.cuda.Stream(dev)
                s.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(s):
                    model(static, workspace_tactic=0, num_logits=bs)  # warm-up run outside the graph
                torch.cuda.current_stream(dev).wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    out = model(static, workspace_tactic=0, num_logits=bs)
                graphs[bs] = (g, static, out)
            torch.cuda.synchronize(dev)
    del kv
    return counters.doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--util", type=float, default=0.92, help="gpu_memory_utilization (default 0.92)")
    p.add_argument("--capacity", type=parse_bytes, default=0, help="mimic a card of this size, e.g. 16GiB")
    p.add_argument("--workspace-extra", type=parse_bytes, default=0, help="make the workspace bigger (diff tests)")
    p.add_argument("--autotune-extra", type=parse_bytes, default=parse_bytes("1GiB"), help="autotune workspace")
    p.add_argument("--out", default=None, help="run directory (default: $MEMTRACE_DIR or memtrace-<time>/)")
    p.add_argument("--stacks", default="python", choices=("none", "python", "all"))
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument(
        "--capture-sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
    )
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("record_startup: needs a CUDA GPU", file=sys.stderr)
        return 2
    outcome = {"outcome": "ok", "phase": None, "error": None}
    with memtrace.trace(a.out, role="worker") as session:
        t0 = time.time()
        try:
            doc = startup(a, session)
        except (torch.OutOfMemoryError, ValueError) as exc:
            oom = session.facts.get(K.OOM) or {}
            outcome = {
                "outcome": "oom" if isinstance(exc, torch.OutOfMemoryError) else "error",
                "phase": oom.get("phase") or session.facts.get(K.DIED_IN),
                "error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}",
            }
            doc = json.loads(session.path.with_suffix(".counters.json").read_text())
        outcome["seconds"] = round(time.time() - t0, 3)
        doc["outcome"] = outcome
        session.set_fact(K.STARTUP_OUTCOME, outcome)
        session.path.with_suffix(".counters.json").write_text(json.dumps(doc, indent=1, sort_keys=True))
        path = session.path
    print(
        f"record_startup: {outcome['outcome']}"
        + (f" in {outcome['phase']}" if outcome["phase"] else "")
        + f"; trace {path}"
    )
    return 0 if outcome["outcome"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
