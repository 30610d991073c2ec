"""Facts read from vLLM's own objects (worker, configs, KV-cache config): plain getattr, never a call
that could change vLLM's state. Every function returns a JSON-friendly dict and tolerates attributes
that a vLLM version does not have (the value is then left out).

Keys (``memtrace.model`` defines the well-known ones):

- ``target_bytes``: ``Worker.requested_memory`` (CUDA; ``ceil(total x util)`` minus external weights),
  else ``CPUWorker.requested_cpu_memory``, else ``ceil(device total x util)``;
- ``gpu_memory_utilization``; ``vllm.available_kv_cache_bytes`` (return of determine_available_memory);
- ``vllm.kv_cache_tokens``, ``vllm.kv_cache_blocks``, ``vllm.kv_cache_bytes``;
- ``vllm.config``: model, dtype, backends and sizes from the command line;
- ``vllm.profile``: vLLM's own profiling figures (weights, non-torch, peak activation, CUDA-graph
  estimate, init snapshot), kept to compare memtrace's reconstruction with;
- ``vllm.kv_cache_size_source`` (profiling, or a size given: the formula does not apply) and
  ``vllm.plugins`` (what ``VLLM_PLUGINS`` let vLLM load).
"""

from __future__ import annotations

import math
import sys
from typing import Any

from memtrace import facts as F

#: The vLLM modules whose constants and functions the facts are read from (``surface`` lists each entry read)
EXTENSIBLE_MODULE = "vllm.v1.worker.extensible_kv_cache"
CAPACITY_MODULE = "vllm.v1.core.kv_cache_utils"
_SCALARS = (bool, int, float, str)


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if obj is None:
            return None
        obj = getattr(obj, part, None)
    return obj


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, _SCALARS):
        return value
    name = getattr(value, "name", None)  # enums
    if isinstance(name, str) and type(value).__module__ != "builtins":
        return name
    if isinstance(value, (list, tuple)) and len(value) <= 64 and all(isinstance(v, _SCALARS) for v in value):
        return list(value)
    return str(value)


_CONFIG_FIELDS = {
    "model": "model_config.model",
    "served_model_name": "model_config.served_model_name",
    "architecture": "model_config.architecture",
    "dtype": "model_config.dtype",
    "max_model_len": "model_config.max_model_len",
    "enforce_eager": "model_config.enforce_eager",
    "quantization": "model_config.quantization",
    "load_format": "load_config.load_format",
    "kv_cache_dtype": "cache_config.cache_dtype",
    "block_size": "cache_config.block_size",
    "kv_cache_memory_bytes": "cache_config.kv_cache_memory_bytes",
    "max_num_batched_tokens": "scheduler_config.max_num_batched_tokens",
    "max_num_seqs": "scheduler_config.max_num_seqs",
    "tensor_parallel_size": "parallel_config.tensor_parallel_size",
    "pipeline_parallel_size": "parallel_config.pipeline_parallel_size",
    "data_parallel_size": "parallel_config.data_parallel_size",
    "enable_expert_parallel": "parallel_config.enable_expert_parallel",
    "distributed_executor_backend": "parallel_config.distributed_executor_backend",
    "compilation_mode": "compilation_config.mode",
    "cudagraph_mode": "compilation_config.cudagraph_mode",
    "moe_backend": "kernel_config.moe_backend",
    "attention_backend": "attention_config.backend",
    "device": "device_config.device_type",
}


def config_facts(worker: Any) -> dict[str, Any]:
    """Model, dtype, sizes and backend choices from the worker's VllmConfig."""
    cfg = getattr(worker, "vllm_config", None)
    out: dict[str, Any] = {}
    for key, path in _CONFIG_FIELDS.items():
        value = _plain(_get(cfg, path))
        if value is not None:
            out[key] = value
    if "moe_backend" not in out:  # older spellings
        for path in ("model_config.moe_backend", "parallel_config.moe_backend"):
            value = _plain(_get(cfg, path))
            if value is not None:
                out["moe_backend"] = value
                break
    out["worker_class"] = f"{type(worker).__module__}.{type(worker).__qualname__}"
    runner = getattr(worker, "model_runner", None)
    if runner is not None:
        out["model_runner_class"] = f"{type(runner).__module__}.{type(runner).__qualname__}"
    v2 = getattr(worker, "use_v2_model_runner", None)
    if isinstance(v2, bool):
        out["use_v2_model_runner"] = v2
    return out


#: The model's own shape, read from vLLM's text config (``model_config.hf_text_config``): what the KV cache, the
#: sampler and the weights scale with, for priors over architectures (issue 43). Absent keys are left out.
_SHAPE_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "sliding_window",
    "tie_word_embeddings",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "max_position_embeddings",  # the rotary cache's rows: part of the weights vLLM reports (capacity/shape.py)
    "partial_rotary_factor",
)


def model_shape_facts(worker: Any) -> dict[str, Any]:
    """Vocabulary, layers, heads, head size, experts, attention kinds of the model, and the CUDA-graph capture
    sizes vLLM resolved (``compilation_config.cudagraph_capture_sizes``)."""
    text = _get(worker, "vllm_config.model_config.hf_text_config")
    if text is None:
        text = _get(worker, "vllm_config.model_config.hf_config")
    out: dict[str, Any] = {}
    for key in _SHAPE_FIELDS:
        value = _plain(getattr(text, key, None))
        if isinstance(value, (bool, int, float, str)):
            out[key] = value
    kinds = getattr(text, "layer_types", None)
    if isinstance(kinds, (list, tuple)) and all(isinstance(k, str) for k in kinds):
        counts: dict[str, int] = {}
        for k in kinds:
            counts[k] = counts.get(k, 0) + 1
        out["layer_types"] = counts
    architectures = getattr(_get(worker, "vllm_config.model_config.hf_config"), "architectures", None)
    if isinstance(architectures, (list, tuple)) and architectures:
        out["architectures"] = [str(a) for a in architectures[:4]]
    sizes = _get(worker, "vllm_config.compilation_config.cudagraph_capture_sizes")
    if isinstance(sizes, (list, tuple)) and all(isinstance(n, int) for n in sizes):
        out["cudagraph_capture_sizes"] = sorted(sizes)
    return out


def kv_group_facts(kv_cache_config: Any) -> list[dict[str, Any]]:
    """vLLM's own KV arithmetic per cache group: the spec's kind, its layers, tokens per block and bytes per
    block (``page_size_bytes``), and a sliding window where the spec has one."""
    out = []
    for group in getattr(kv_cache_config, "kv_cache_groups", None) or []:
        spec = getattr(group, "kv_cache_spec", None)
        row: dict[str, Any] = {"spec": type(spec).__name__, "layers": len(getattr(group, "layer_names", None) or [])}
        for key in ("block_size", "page_size_bytes", "sliding_window", "attention_chunk_size"):
            value = getattr(spec, key, None)
            if isinstance(value, int) and not isinstance(value, bool):
                row[key] = value
        out.append(row)
    return out


def target_facts(worker: Any, device_total_bytes: int | None = None) -> dict[str, Any]:
    """``target_bytes`` and ``gpu_memory_utilization`` (see the module docstring for the order).

    vLLM 0.34 leaves ``gpu_memory_utilization`` None unless the user set it and resolves it with the
    sizing mode (``resolved_gpu_memory_utilization``: 1.0 with the extensible KV cache, else 0.92)."""
    util = _get(worker, "cache_config.gpu_memory_utilization")
    if util is None:
        util = _get(worker, "cache_config.resolved_gpu_memory_utilization")
    out: dict[str, Any] = {}
    if isinstance(util, (int, float)):
        out[F.UTIL] = float(util)
    for attr in ("requested_memory", "requested_cpu_memory"):
        value = getattr(worker, attr, None)
        if isinstance(value, (int, float)) and value > 0:
            out[F.TARGET_BYTES] = int(value)
            out[F.TARGET_SOURCE] = f"{type(worker).__name__}.{attr}"
            return out
    total = _get(worker, "init_snapshot.total_memory") or device_total_bytes
    if isinstance(total, int) and total > 0 and F.UTIL in out:
        out[F.TARGET_BYTES] = math.ceil(total * out[F.UTIL])
        out[F.TARGET_SOURCE] = "device total x gpu_memory_utilization"
    return out


UTIL_FLAG = "--gpu-memory-utilization"


def util_source(worker: Any, version: tuple[int, int] | None, argv: list[str]) -> str:
    """Who chose the utilization target: ``user``, ``vllm-default`` or ``unknown`` (facts.UTIL_SOURCE).

    From 0.34 vLLM keeps the user's value apart (None when unset). Before, the field always holds a
    number: the flag on the command line (or a value other than the 0.92 default) means the user's."""
    cache = getattr(worker, "cache_config", None)
    if version is not None and version >= (0, 34) and hasattr(cache, "resolved_gpu_memory_utilization"):
        return F.UTIL_VLLM_DEFAULT if getattr(cache, "gpu_memory_utilization", None) is None else F.UTIL_BY_USER
    if any(a == UTIL_FLAG or a.startswith(UTIL_FLAG + "=") for a in argv):
        return F.UTIL_BY_USER
    util = getattr(cache, "gpu_memory_utilization", None)
    if isinstance(util, float) and util != 0.92:
        return F.UTIL_BY_USER
    serving = any(a in ("serve",) or a.endswith("api_server") for a in argv)
    return F.UTIL_VLLM_DEFAULT if serving else F.UTIL_UNKNOWN


def extensible(worker: Any) -> bool:
    """Whether vLLM (0.34+) sizes this worker's KV cache as an extensible one."""
    return _get(worker, "cache_config.enable_extensible_kv_cache") is True


def _kv_cache(worker_or_runner: Any) -> Any:
    runner = getattr(worker_or_runner, "model_runner", worker_or_runner)
    return getattr(runner, "extensible_kv_cache", None)


def _ints(obj: Any, fields: dict[str, str]) -> dict[str, int]:
    out = {}
    for key, path in fields.items():
        v = _get(obj, path)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = int(v)
    return out


_SIZING_CACHE_FIELDS = {
    "committed_bytes": "physical_bytes",
    "transient_peak_bytes": "reserved_headroom_bytes",
    "torch_reserve_growth_bytes": "torch_reserve_growth_bytes",
    "bytes_per_block": "bytes_per_block",
    "capacity_blocks": "capacity_blocks",
}


def sizing_inputs(kv_cache: Any, init_free: Any, requested: Any) -> dict[str, Any]:
    """What vLLM 0.34's ``measure_kv_cache_blocks`` sizes the KV cache from, read as it is called."""
    out: dict[str, Any] = _ints(kv_cache, _SIZING_CACHE_FIELDS)
    for key, path in (("granularity_bytes", "buffer.granularity"), ("segment_strides", "segment_strides")):
        value = _get(kv_cache, path)
        if isinstance(value, int) or (isinstance(value, list) and all(isinstance(x, int) for x in value)):
            out[key] = value
    for key, value in (("init_free_memory_bytes", init_free), ("requested_memory_bytes", requested)):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = int(value)
    module = sys.modules.get(EXTENSIBLE_MODULE)
    for key, attr in (
        ("margin_floor_bytes", "KV_CACHE_MARGIN_FLOOR_BYTES"),
        ("non_torch_reserve_bytes", "KV_CACHE_NON_TORCH_RESERVE_BYTES"),
        ("warmup_reserve_fraction", "KV_CACHE_WARMUP_RESERVE_FRACTION"),
        ("margin_fraction", "KV_CACHE_MARGIN_FRACTION"),
    ):
        value = getattr(module, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
    return out


_EXTENSIBLE_FIELDS = {
    "capacity_blocks": "capacity_blocks",
    "reserved_bytes": "buffer.capacity_bytes",
    "granularity_bytes": "buffer.granularity",
    "bytes_per_block": "bytes_per_block",
    "committed_blocks": "num_committed_blocks",
    "physical_bytes": "physical_bytes",
    "torch_memory_limit_bytes": "torch_memory_limit",
}


def extensible_facts(worker: Any) -> dict[str, Any]:
    """The extensible KV cache as it stands (vLLM 0.34+): capacity, address space, committed blocks/bytes,
    and its segments' block strides (one segment per layer in layer-outermost layouts: each is committed
    in whole granules, which is why the committed bytes exceed blocks x bytes per block)."""
    kv_cache = _kv_cache(worker)
    if kv_cache is None:
        return {}
    out: dict[str, Any] = _ints(kv_cache, _EXTENSIBLE_FIELDS)
    strides = getattr(kv_cache, "segment_strides", None)
    if isinstance(strides, list) and all(isinstance(x, int) for x in strides):
        out["segment_strides"] = strides
    return out


_SNAPSHOT_FIELDS = ("torch_peak", "free_memory", "total_memory", "cuda_memory", "torch_memory", "non_torch_memory")


def _snapshot(snap: Any) -> dict[str, int] | None:
    if snap is None:
        return None
    out = {f: int(v) for f in _SNAPSHOT_FIELDS if isinstance(v := getattr(snap, f, None), (int, float))}
    ts = getattr(snap, "timestamp", None)
    if isinstance(ts, float) and ts > 0:
        out["time_us"] = int(ts * 1_000_000)
    return out or None


def profile_facts(worker: Any) -> dict[str, Any]:
    """vLLM's own profiling figures, after determine_available_memory (bytes)."""
    out: dict[str, Any] = {}
    runner = getattr(worker, "model_runner", None)
    weights = getattr(runner, "model_memory_usage", None)
    if isinstance(weights, (int, float)):
        out["weights_memory_bytes"] = int(weights)
    for attr in (
        "requested_memory",
        "available_kv_cache_memory_bytes",
        "non_torch_memory",  # 0.25.1: non-torch increase
        "total_consumed",  # 0.32+: free-memory drop since init
        "peak_activation_memory",
        "cudagraph_memory_estimate",
    ):
        value = getattr(worker, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{attr}_bytes" if not attr.endswith("_bytes") else attr] = int(value)
    init = _snapshot(getattr(worker, "init_snapshot", None))
    if init:
        out["init_snapshot"] = init
    return out


def kv_cache_facts(kv_cache_config: Any, worker: Any = None) -> dict[str, Any]:
    """Blocks, bytes and tokens of the KV cache about to be allocated."""
    out: dict[str, Any] = {}
    blocks = getattr(kv_cache_config, "num_blocks", None)
    if isinstance(blocks, int):
        out[F.VLLM_KV_BLOCKS] = blocks
    tensors = getattr(kv_cache_config, "kv_cache_tensors", None) or []
    sizes = [getattr(t, "size", None) for t in tensors]
    if sizes and all(isinstance(s, int) for s in sizes):
        out[F.VLLM_KV_BYTES] = int(sum(sizes))
    tokens = _get(worker, "cache_config.kv_cache_size_tokens")
    if not isinstance(tokens, int):
        tokens = _kv_tokens(kv_cache_config, worker)
    if isinstance(tokens, int):
        out[F.VLLM_KV_TOKENS] = tokens
    try:
        groups = kv_group_facts(kv_cache_config)
    except Exception:  # noqa: BLE001 - a spec this vLLM builds differently: left out
        groups = []
    if groups:
        out[F.VLLM_KV_GROUPS] = groups
    return out


def _kv_tokens(kv_cache_config: Any, worker: Any) -> int | None:
    try:
        utils = sys.modules.get(CAPACITY_MODULE)
        capacity = getattr(utils, "get_kv_cache_capacity", None)
        if capacity is not None and getattr(worker, "vllm_config", None) is not None:
            return int(capacity(worker.vllm_config, kv_cache_config)[0])
    except Exception:  # noqa: BLE001 - fall back to blocks x block size below
        pass
    groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
    blocks = getattr(kv_cache_config, "num_blocks", None)
    if len(groups) == 1 and isinstance(blocks, int):
        bs = _get(groups[0], "kv_cache_spec.block_size")
        if isinstance(bs, int):
            return blocks * bs
    return None


PLUGIN_GROUPS = {"general": "vllm.general_plugins", "platform": "vllm.platform_plugins"}


def plugin_facts(environ: dict[str, str]) -> dict[str, Any]:
    """Which general and platform plugins vLLM loads in this process: every installed one when
    ``VLLM_PLUGINS`` is unset, else only those it names (vLLM splits the value on commas, unstripped)."""
    from importlib.metadata import entry_points

    value = environ.get("VLLM_PLUGINS")
    allowed = None if value is None else value.split(",")
    out: dict[str, Any] = {"VLLM_PLUGINS": value}
    installed = entry_points()  # one scan of the installed distributions (this runs on vLLM's path)
    for key, group in PLUGIN_GROUPS.items():
        names = sorted({ep.name for ep in installed.select(group=group)})
        out[key] = [n for n in names if allowed is None or n in allowed]
    return out


def kv_bytes_given(worker: Any) -> Any:
    """``--kv-cache-memory-bytes`` as vLLM holds it (None when not given)."""
    return _get(worker, "cache_config.kv_cache_memory_bytes")


def kv_size_source(explicit_before: Any, worker: Any) -> str:
    """How vLLM sized the KV cache in ``determine_available_memory``: ``--kv-cache-memory-bytes`` when it
    was set before the call, ``VLLM_ENABLE_STARTUP_PLAN`` when a persisted plan set it during the call
    (vLLM >= 0.32), ``extensible`` when vLLM 0.34 measures it after warm-up (the profiled figure then only
    sizes the address range), else ``profiling``."""
    if explicit_before:
        return F.KV_SIZE_GIVEN_FLAG
    if kv_bytes_given(worker):
        return F.KV_SIZE_GIVEN_PLAN
    if extensible(worker):
        return F.KV_SIZED_EXTENSIBLE
    return F.KV_SIZED_BY_PROFILING


def rank_facts(worker: Any) -> dict[str, Any]:
    """rank, local_rank, world_size for the session."""
    out = {}
    for key, path in (("rank", "rank"), ("local_rank", "local_rank"), ("world_size", "parallel_config.world_size")):
        value = _get(worker, path)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    return out
