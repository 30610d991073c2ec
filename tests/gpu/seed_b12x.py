"""The seed's b12x workspaces, from FlashInfer's own allocators: one B12xMoEWrapper per MoE layer.

Run on a GPU with FlashInfer importable (0.6.13 as vLLM 0.25.1 pins it, or 0.7.x)::

    python tests/gpu/seed_b12x.py --out DIR            # one wrapper's workspaces per MoE layer
    python tests/gpu/seed_b12x.py --out DIR --shared   # 0.7.x: one set shared by every layer (flashinfer#4603)

What vLLM 0.25.1 allocates for ``nvidia/Qwen3.6-35B-A3B-NVFP4`` at the seed's flags
(``--max-num-batched-tokens 8192 --max-num-seqs 8``, vllm-project/vllm#49476): on each MoE layer's
first forward (inside ``profile_run``), ``FlashInferB12xExperts._ensure_wrapper`` builds
``B12xMoEWrapper(num_experts=256, top_k=8, hidden_size=2048, intermediate_size=512,
use_cuda_graph=True, max_num_tokens=8192, num_local_experts=256, activation="silu")``
(``max_num_tokens`` is ``max_num_batched_tokens``; ``--max-num-seqs`` plays no part), and its
``_allocate_buffers`` allocates a static workspace (routed rows capped at the static cutover), a
dynamic workspace (all 8192 x 8 routed rows) and a bf16 output buffer [8192, 2048]. The model has
40 decoder layers, every one a sparse-MoE layer (Qwen3.5/3.6-35B-A3B text config: hidden 2048,
256 experts, top-8, moe_intermediate_size 512; the MTP layer is not built without speculative
decoding).

The wrapper only allocates tensors; its compute-capability mark (120/121) is not enforced at
construction, so it should construct on the H200 (it needs CUDA 13). If it refuses, the script
calls ``allocate_sm120_moe_workspace`` with the exact arguments ``_allocate_buffers`` would pass
(:func:`allocator_calls`) plus the output buffer, and says so. Everything is traced with
``memtrace.trace(DIR)`` and memtrace's FlashInfer hooks (installed before FlashInfer is imported).
Prints the total (PyTorch allocated delta and the bytes the hooked calls returned) and the bytes per
hook target, against the 0.6.13 prediction of :func:`expected_0613_bytes` and the seed's 11.47 GiB.

The argument computation and the 0.6.13 prediction are pure functions, unit-tested on CPU
(tests/unit/test_seed_b12x.py); the prediction reproduces the 94,974,860 B the real 0.6.13 dynamic
allocator returned on the H200 (tests/data/vllm-h200/flashinfer-probe).
"""

from __future__ import annotations

import argparse
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30
#: The seed's figure: 64.36 GiB of KV cache with marlin, 52.89 GiB with b12x on the same 96 GB card.
SEED_DIFFERENCE_GIB = 11.47
#: 0.6.13's static/dynamic cutover in routed pairs (``_STATIC_COMPACT_CUTOVER_PAIRS_DEFAULT``).
CUTOVER_0613 = 640
_NVFP4_BLOCK = 16
_TILE_M = _TILE_N = 128  # 0.6.13 ``_LEVEL_TILE_M`` / ``_LEVEL_TILE_N``
_SLICE_CHUNK = 1  # 0.6.13 ``_DYNAMIC_SLICE_CHUNK``


@dataclass(frozen=True)
class MoeModel:
    """The MoE shape of a model, as vLLM's FusedMoEConfig sees it (TP 1, no expert parallelism)."""

    name: str
    moe_layers: int
    num_experts: int
    top_k: int
    hidden_size: int
    moe_intermediate_size: int


#: nvidia/Qwen3.6-35B-A3B-NVFP4 (Qwen3_5MoeForConditionalGeneration, text config).
SEED_MODEL = MoeModel("nvidia/Qwen3.6-35B-A3B-NVFP4", 40, 256, 8, 2048, 512)


def wrapper_kwargs(model: MoeModel, max_num_batched_tokens: int) -> dict:
    """What vLLM 0.25.1's ``FlashInferB12xExperts._ensure_wrapper`` passes to ``B12xMoEWrapper``."""
    return {
        "num_experts": model.num_experts,
        "top_k": model.top_k,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.moe_intermediate_size,
        "use_cuda_graph": True,
        "max_num_tokens": max_num_batched_tokens,
        "num_local_experts": model.num_experts,
        "activation": "silu",
    }


def allocator_calls(model: MoeModel, max_num_tokens: int, *, cutover_pairs: int) -> list[dict]:
    """The ``allocate_sm120_moe_workspace`` keyword arguments of one wrapper's ``_allocate_buffers``
    (nvfp4), in call order: the static workspace, then the dynamic one when the routed rows pass
    the cutover (``select_sm120_moe_backend``). ``device`` is left to the caller."""
    routed = max_num_tokens * model.top_k
    dynamic = routed > cutover_pairs
    common = {
        "state_E": model.num_experts,
        "weight_E": model.num_experts,
        "k": model.hidden_size,
        "n": model.moe_intermediate_size,
        "num_topk": model.top_k,
        "quant_mode": "nvfp4",
        "activation": "silu",
    }
    calls = [{**common, "max_rows": max(1, min(routed, cutover_pairs) if dynamic else routed), "backend": "static"}]
    if dynamic:
        calls.append({**common, "routed_rows": routed, "backend": "dynamic"})
    return calls


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def static_0613_bytes(*, state_E: int, weight_E: int, max_rows: int, k: int, **_: object) -> int:
    """Bytes of 0.6.13's ``allocate_sm120_static_workspace`` tensors (n is unused there)."""
    cpk = _align(k // _NVFP4_BLOCK, 4)
    big = state_E * max_rows * (k // 2) + state_E * _align(max_rows, 128) * cpk
    per_row = 2 * 4 * state_E * max_rows  # token_map int32, token_weights f32
    small = 4 * (state_E + 3 + state_E + weight_E + max(state_E, max_rows))
    return big + per_row + small


def dynamic_0613_bytes(*, state_E: int, routed_rows: int, k: int, n: int, **_: object) -> int:
    """Bytes of 0.6.13's ``allocate_sm120_dynamic_workspace`` tensors."""
    rows = max(1, routed_rows)
    tiles = max(1, _align(rows, _TILE_M) // _TILE_M + min(state_E, rows) - 1)
    slices = max(1, (max(1, -(-n // _TILE_N)) + _SLICE_CHUNK - 1) // _SLICE_CHUNK)
    tasks = tiles * slices
    padded = tiles * _TILE_M
    big = padded * (k // 2) + padded * _align(k // _NVFP4_BLOCK, 4) + 2 * 4 * padded
    small = 4 * (state_E + 2 + state_E + state_E + 1 + 5 + 6 * tasks + tiles)
    return big + small


def output_bytes(model: MoeModel, max_num_tokens: int) -> int:
    """The wrapper's bf16 output buffer [max_num_tokens, hidden]."""
    return 2 * max_num_tokens * model.hidden_size


def expected_0613_bytes(model: MoeModel, max_num_tokens: int, *, cutover_pairs: int = CUTOVER_0613) -> dict:
    """FlashInfer 0.6.13's bytes for one wrapper, by buffer, and for every MoE layer."""
    per = {}
    for call in allocator_calls(model, max_num_tokens, cutover_pairs=cutover_pairs):
        size = static_0613_bytes(**call) if call["backend"] == "static" else dynamic_0613_bytes(**call)
        per[call["backend"]] = size
    per["output"] = output_bytes(model, max_num_tokens)
    per["one_layer"] = sum(per.values())
    per["all_layers"] = per["one_layer"] * model.moe_layers
    return per


# -- on the GPU ---------------------------------------------------------------------------------------


def _accepted(func, kwargs: dict) -> dict:
    """``kwargs`` without the names ``func`` does not take (the signatures move between releases)."""
    params = inspect.signature(func).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def _cutover(dispatch, model: MoeModel, max_num_tokens: int) -> int:
    """The installed FlashInfer's static cutover for this shape (0.7.x keys it by shape and SM count)."""
    func = getattr(dispatch, "_get_static_compact_cutover_pairs", None)
    if func is None:
        return CUTOVER_0613
    kw = {"quant_mode": "nvfp4", "num_experts": model.num_experts, "intermediate_size": model.moe_intermediate_size,
          "hidden_size": model.hidden_size, "activation": "silu", "num_topk": model.top_k,
          "capacity_tokens": max_num_tokens}  # fmt: skip
    return int(func("fp4", **{k: v for k, v in _accepted(func, kw).items()}))


def _build_layers(args, model: MoeModel, torch, memtrace) -> tuple[str, list]:
    """One wrapper (or one allocator set) per MoE layer, each in its own phase; returns (path, keep)."""
    from flashinfer.fused_moe.cute_dsl import b12x_moe
    from flashinfer.fused_moe.cute_dsl.blackwell_sm12x import moe_dispatch as dispatch

    kwargs = wrapper_kwargs(model, args.max_num_batched_tokens)
    keep: list = []
    shared: dict = {}
    if args.mode in ("auto", "wrapper"):
        try:
            for layer in range(args.layers):
                with memtrace.phase(f"moe_layer_{layer}"):
                    w = b12x_moe.B12xMoEWrapper(**kwargs, **shared)
                keep.append(w)
                if args.shared and not shared:
                    shared = {"shared_static_workspace": w._static_workspace,
                              "shared_dynamic_workspace": w._dynamic_workspace, "shared_output": w._moe_output}  # fmt: skip
            return "B12xMoEWrapper", keep
        except Exception as exc:  # the wrapper refused (Hopper, CUDA 12, a missing kernel library)
            if args.mode == "wrapper" or keep:
                raise
            print(f"B12xMoEWrapper refused ({type(exc).__name__}: {exc}); calling the allocators instead")
    cutover = _cutover(dispatch, model, args.max_num_batched_tokens)
    calls = allocator_calls(model, args.max_num_batched_tokens, cutover_pairs=cutover)
    print(f"allocator path, cutover {cutover} routed pairs; per layer: {calls} + output bf16")
    dev = torch.device("cuda")
    for layer in range(1 if args.shared else args.layers):
        with memtrace.phase(f"moe_layer_{layer}"):
            for call in calls:
                keep.append(dispatch.allocate_sm120_moe_workspace(**_accepted(dispatch.allocate_sm120_moe_workspace,
                                                                              call), device=dev))  # fmt: skip
            keep.append(torch.empty((args.max_num_batched_tokens, model.hidden_size), dtype=torch.bfloat16, device=dev))
    return "allocate_sm120_moe_workspace", keep


def _report(path: Path, args, model: MoeModel, how: str, allocated: int, reserved: int, version: str) -> None:
    from memtrace.analysis.gate.diff import figures
    from memtrace.analysis.holders.flame import hook_short_name
    from memtrace.store import load_trace

    trace = load_trace(path)
    outer = figures(trace).hooks  # what memtrace diff gates: bytes each outermost hooked call added, per target
    print(f"flashinfer {version}; {how}; {args.layers} MoE layers{' (shared workspaces)' if args.shared else ''}")
    print(f"total PyTorch allocated delta: {allocated} B ({allocated / GiB:.2f} GiB); reserved delta {reserved} B")
    print(f"total added by outermost hooked calls (memtrace diff's figure): {sum(map(sum, outer.values()))} B")
    for name, sizes in sorted(outer.items()):
        print(f"  {hook_short_name(name)}: {len(sizes)} outermost calls, {sum(sizes)} B added")
    names = sorted({c.name for c in trace.hook_calls})
    for name in names:
        calls = [c for c in trace.hook_calls if c.name == name]
        ret = sum(c.returned_bytes or 0 for c in calls)
        delta = sum(c.allocated_delta_bytes or 0 for c in calls)
        nested = sum(c.parent is not None for c in calls)
        print(f"  {hook_short_name(name)}: {len(calls)} calls ({nested} nested), returned {ret} B, "
              f"allocated delta {delta} B")  # fmt: skip
    exp = expected_0613_bytes(model, args.max_num_batched_tokens)
    print(f"0.6.13 prediction per layer: {exp}")
    seed = round(SEED_DIFFERENCE_GIB * GiB)
    print(f"seed's b12x - marlin difference {SEED_DIFFERENCE_GIB} GiB ~ {seed} B; measured - seed = "
          f"{allocated - seed} B ({(allocated - seed) / GiB:+.2f} GiB)")  # fmt: skip
    print(f"trace: {path}  (memtrace report {path}; memtrace diff A B for 0.6.13 -> 0.7.x)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="run directory for the trace")
    p.add_argument("--shared", action="store_true", help="one set of workspaces shared by every layer (0.7.x)")
    p.add_argument("--layers", type=int, default=SEED_MODEL.moe_layers)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=8, help="recorded only: the b12x wrapper does not use it")
    p.add_argument("--mode", choices=("auto", "wrapper", "allocators"), default="auto")
    args = p.parse_args(argv)

    import memtrace
    import torch
    from memtrace.plugins import surface
    from memtrace.plugins.hooks import HookManager

    model = SEED_MODEL
    with memtrace.trace(args.out, role="seed-b12x") as session:
        surface.install_workspace_hooks(HookManager(), session.record_hook_call)  # before FlashInfer is imported
        import flashinfer
        from flashinfer.fused_moe.cute_dsl import b12x_moe

        if args.shared and "shared_static_workspace" not in inspect.signature(b12x_moe.B12xMoEWrapper).parameters:
            print(f"flashinfer {flashinfer.__version__} has no shared-workspace API (flashinfer#4603, 0.7.x)")
            return 2
        torch.cuda.synchronize()
        a0, r0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        how, keep = _build_layers(args, model, torch, memtrace)
        torch.cuda.synchronize()
        allocated, reserved = torch.cuda.memory_allocated() - a0, torch.cuda.memory_reserved() - r0
        path = session.path
    _report(path, args, model, how, allocated, reserved, flashinfer.__version__)
    del keep
    return 0


if __name__ == "__main__":
    sys.exit(main())
