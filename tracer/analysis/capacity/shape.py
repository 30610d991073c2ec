"""A model's shape from its config, and what vLLM 0.34 makes of it: the KV cache's bytes and the weights' bytes.

Pure arithmetic on ints (no torch). The shape comes from a trace's facts (``vllm.model_shape`` and
``vllm.config``) or from a Hugging Face ``config.json``; a field neither gives is None and listed by
:meth:`ModelShape.missing`, never guessed. The KV figures follow vLLM 0.34's own code, cited per function
(``vllm/v1/kv_cache_interface.py``, ``vllm/v1/core/kv_cache_planning.py``, ``kv_cache_utils.py``,
``vllm/platforms/interface.py``); the weights follow vLLM's layers (padded vocabulary, TP shards, the
rotary cos/sin cache it keeps beside the parameters). A local checkpoint gives the weights exactly:
:func:`weights_from_safetensors` reads only the files' headers.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrace import facts as F
from memtrace.errors import UsageError

#: Bytes per element of the dtypes vLLM's configs and ``--kv-cache-dtype`` name (``auto``: the model's).
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1, "int8": 1}  # fmt: skip
#: ``--kv-cache-dtype``'s values the what-if takes (``auto``: the model's dtype), in the order its errors list them
KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "auto", "bfloat16", "float16", "half")
#: safetensors' dtype names (header ``dtype``) -> bits per element
_ST_BITS = {"F64": 64, "I64": 64, "U64": 64, "F32": 32, "I32": 32, "U32": 32, "F16": 16, "BF16": 16,
            "I16": 16, "U16": 16, "I8": 8, "U8": 8, "BOOL": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
            "F4": 4}  # fmt: skip
#: vLLM pads the vocabulary of its embedding and LM head to a multiple of this (``DEFAULT_VOCAB_PADDING_SIZE``)
VOCAB_PADDING = 64
#: Blocks a linear-attention (mamba-like) group holds per request: with prefix caching (vLLM's default for
#: hybrid models) ``mamba_cache_mode`` is ``align``: 2 state blocks + 1 prefill checkpoint (FlashInfer's GDN
#: prefill, chosen on Hopper) — ``MambaSpec.max_memory_usage_bytes``. ``none`` would hold 1.
MAMBA_BLOCKS_PER_REQUEST = 3
#: Concurrent batches whose tokens are in flight (async scheduling, on by default): sliding-window layers keep
#: ``window - 1 + this x max_num_batched_tokens`` tokens (``VllmConfig.max_in_flight_tokens``)
CONCURRENT_BATCHES = 2
_QK_NORM = ("qwen3", "gemma3")  # model_type prefixes whose attention has q_norm and k_norm (head_dim each)
_GATED_Q = ("qwen3_next", "qwen3_5")  # q_proj also yields the output gate (twice the width)
_LINEAR = ("qwen3_next", "qwen3_5")  # hybrids: layer_types default 3 linear : 1 full
_REQUIRED = ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "dtype")
_LINEAR_DIMS = ("linear_key_heads", "linear_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                "linear_conv_kernel")  # fmt: skip
_FLAGS = ("kv_cache_dtype", "block_size", "max_model_len")
#: Architectures vLLM 0.34 runs without torch.compile on CUDA (breakable CUDA graphs by default:
#: ``config/vllm.py`` ``default_breakable_cudagraph_architectures``, which sets ``CompilationMode.NONE``); a
#: recording's own ``compilation_mode`` overrides this table
VLLM_034_NO_COMPILE = frozenset({
    "AliceAIForCausalLM", "BeamForCausalLM", "DeepseekV32MTPModel", "DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM",
    "DeepseekV4ForConditionalGeneration", "DeepSeekV4MTPModel", "DeepseekV41ForCausalLM", "Dots3NoteForCausalLM",
    "Dots3NoteMTPModel", "Glm5NextForCausalLM", "Glm5NextForConditionalGeneration", "Glm5NextMTPModel",
    "GlmMoeDsaForCausalLM", "HYV4ForCausalLM", "HYV4MTPModel", "InklingForCausalLM", "InklingForConditionalGeneration",
    "KimiK3ForConditionalGeneration", "KimiK3MTPModel", "KimiK31ForConditionalGeneration", "KimiLinearForCausalLM",
    "MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration", "MistralLarge4ForCausalLM",
    "MuseSparkForCausalLM", "MuseSparkForConditionalGeneration", "Qwen4ExpForCausalLM",
    "Qwen4ExpForConditionalGeneration", "Qwen4ExpMTP", "Step5ForCausalLM", "Step5ForConditionalGeneration",
    "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MTP", "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeMTP",
})  # fmt: skip


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache, the weights and the sampler scale with, plus the vLLM flags that size them."""

    architecture: str | None = None
    model_type: str | None = None
    vocab: int | None = None
    hidden: int | None = None
    intermediate: int | None = None
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate: int | None = None
    shared_expert_intermediate: int = 0
    sliding_window: int | None = None
    full_layers: int | None = None  # layer kinds: full / sliding-window / linear attention
    sliding_layers: int = 0
    linear_layers: int = 0
    linear_key_heads: int | None = None
    linear_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel: int | None = None
    tie_word_embeddings: bool = False
    max_position: int | None = None  # the rotary cache's rows
    rotary_dim: int | None = None
    dtype: str | None = None  # the model's ("bfloat16")
    kv_cache_dtype: str | None = None  # vLLM's flags, from vllm.config
    block_size: int | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    tensor_parallel: int = 1
    multimodal: bool = False  # a vision tower beside the text model: its weights are not in weights_bytes
    #: whether vLLM torch.compiles this model when not told enforce-eager: a compiled recording's
    #: ``compilation_mode``; None where nothing recorded it (an eager recording, a config)
    compiles: bool | None = None

    @property
    def torch_compiled(self) -> bool:
        """vLLM torch.compiles it unless enforce-eager: as recorded, else not for the architectures vLLM 0.34 runs
        with breakable CUDA graphs (:data:`VLLM_034_NO_COMPILE`)."""
        return self.compiles if self.compiles is not None else self.architecture not in VLLM_034_NO_COMPILE

    @classmethod
    def from_facts(cls, facts: dict[str, Any]) -> ModelShape:
        """From a trace's ``vllm.model_shape`` (Hugging Face names; ``layer_types`` as counts) and
        ``vllm.config`` (dtype, kv_cache_dtype, block_size, max_model_len, tensor_parallel_size, ...)."""
        shape = dict(facts.get(F.VLLM_MODEL_SHAPE) or {})
        arch = (shape.get("architectures") or [None])[0]
        return _build(shape, arch, facts.get(F.VLLM_CONFIG) or {})

    @classmethod
    def from_config(cls, path: str | Path) -> ModelShape:
        """From a ``config.json`` (:func:`read_config`); vLLM's flags are left None: ``dataclasses.replace`` them in."""
        return cls.from_facts({F.VLLM_MODEL_SHAPE: read_config(path)})

    def missing(self) -> list[str]:
        """The fields the KV cache and weights need that neither the facts nor the config gave, and
        ``vision_weights`` for a multimodal model (the vision tower is not counted: read the checkpoint)."""
        need = [*_REQUIRED, "moe_intermediate" if self.experts else "intermediate", "full_layers"]
        need += ["max_position", "rotary_dim", *_FLAGS]
        need += ["sliding_window", "max_num_batched_tokens"] * bool(self.sliding_layers)
        need += list(_LINEAR_DIMS) * bool(self.linear_layers)
        return [n for n in need if getattr(self, n) is None] + ["vision_weights"] * self.multimodal


def _int(d: dict, *keys: str) -> int | None:
    return next((d[k] for k in keys if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)), None)


def _dtype(value: Any) -> str | None:
    return str(value).removeprefix("torch.") if value else None


def config_error(path: str | Path, what: str) -> UsageError:
    """The one message of a model config memtrace cannot use: what is wrong with it, and what to give instead."""
    return UsageError(f"{path}: {what}; give a language model's complete config.json, or its checkpoint's folder")


def read_config(path: str | Path) -> dict:
    """The one reader of a Hugging Face ``config.json`` (or its folder): the text model's fields as the fact
    ``vllm.model_shape`` holds them (vLLM's ``hf_text_config``), ``architectures``, ``torch_dtype``, ``multimodal``
    (a vision tower beside it) and ``source``; :func:`config_error` where it is unreadable or not a language model's."""
    path = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise config_error(path, f"cannot read it ({e.strerror or e})") from None
    except ValueError as e:  # UnicodeDecodeError too
        raise config_error(path, f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise config_error(path, "not a JSON object")
    text = doc["text_config"] if isinstance(doc.get("text_config"), dict) else doc
    if not text.get("hidden_size") or not text.get("num_hidden_layers"):
        raise config_error(path, "the config lacks hidden_size / num_hidden_layers")
    dtype = text.get("torch_dtype") or text.get("dtype") or doc.get("torch_dtype") or doc.get("dtype")
    return {**text, "architectures": doc.get("architectures") or text.get("architectures"), "torch_dtype": dtype,
            "multimodal": isinstance(doc.get("vision_config"), dict), "source": f"config {path}"}  # fmt: skip


def _kinds(d: dict, model_type: str, layers: int | None, window: int | None) -> tuple[int | None, int, int]:
    """(full, sliding, linear) layer counts: ``layer_types`` as a list (config) or counts (facts), else
    computed as transformers does (gemma3: every 6th full; qwen3_next / qwen3_5: every 4th full), else all
    layers sliding when the config has a window (vLLM's model-level ``cache_config.sliding_window``)."""
    kinds = d.get("layer_types")
    if isinstance(kinds, list):
        kinds = {k: kinds.count(k) for k in set(kinds)}
    if isinstance(kinds, dict):
        return kinds.get("full_attention", 0), kinds.get("sliding_attention", 0), kinds.get("linear_attention", 0)
    if layers is None:
        return None, 0, 0
    if model_type.startswith("gemma3"):
        period = d.get("sliding_window_pattern", 6)
        full = sum(1 for i in range(layers) if (i + 1) % period == 0)
        return full, layers - full, 0
    if model_type.startswith(_LINEAR):
        full = sum(1 for i in range(layers) if (i + 1) % d.get("full_attention_interval", 4) == 0)
        return full, 0, layers - full
    return (0, layers, 0) if window else (layers, 0, 0)


def _build(d: dict, arch: str | None, cfg: dict) -> ModelShape:
    mt = str(d.get("model_type") or "")
    layers, heads, hidden = _int(d, "num_hidden_layers"), _int(d, "num_attention_heads"), _int(d, "hidden_size")
    head_dim = _int(d, "head_dim") or (hidden // heads if hidden and heads else None)  # transformers' default
    window = None if d.get("use_sliding_window") is False else _int(d, "sliding_window")
    full, sliding, linear = _kinds(d, mt, layers, window)
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    factor = d.get("partial_rotary_factor") or rope.get("partial_rotary_factor")
    factor = factor or (0.25 if mt.startswith(_LINEAR) else 1.0)  # transformers' default for the hybrids
    tie = d.get("tie_word_embeddings")
    return ModelShape(
        architecture=arch, model_type=mt or None, vocab=_int(d, "vocab_size"), hidden=hidden,
        intermediate=_int(d, "intermediate_size"), layers=layers, heads=heads,
        kv_heads=_int(d, "num_key_value_heads") or heads, head_dim=head_dim,
        experts=_int(d, "num_experts", "num_local_experts") or 0, experts_per_tok=_int(d, "num_experts_per_tok") or 0,
        moe_intermediate=_int(d, "moe_intermediate_size"),
        shared_expert_intermediate=_int(d, "shared_expert_intermediate_size") or 0,
        sliding_window=window if sliding else None, full_layers=full, sliding_layers=sliding, linear_layers=linear,
        linear_key_heads=_int(d, "linear_num_key_heads"), linear_value_heads=_int(d, "linear_num_value_heads"),
        linear_key_head_dim=_int(d, "linear_key_head_dim"), linear_value_head_dim=_int(d, "linear_value_head_dim"),
        linear_conv_kernel=_int(d, "linear_conv_kernel_dim"),
        tie_word_embeddings=bool(tie) if tie is not None else mt.startswith("gemma"),
        max_position=_int(d, "max_position_embeddings"),
        rotary_dim=int(head_dim * factor) if head_dim else None,
        dtype=_dtype(cfg.get("dtype") or d.get("dtype") or d.get("torch_dtype")),
        kv_cache_dtype=cfg.get("kv_cache_dtype"), block_size=_int(cfg, "block_size"),
        max_model_len=_int(cfg, "max_model_len"), max_num_batched_tokens=_int(cfg, "max_num_batched_tokens"),
        tensor_parallel=_int(cfg, "tensor_parallel_size") or 1, multimodal=d.get("multimodal") is True,
        compiles=None if cfg.get("enforce_eager") or cfg.get("compilation_mode") is None else bool(cfg["compilation_mode"]),
    )  # fmt: skip


def _need(shape: ModelShape, *names: str) -> None:
    lacking = [n for n in names if getattr(shape, n) is None]
    if lacking:
        raise ValueError(f"the model's shape lacks {', '.join(lacking)} (ModelShape.missing)")


def dtype_bytes(dtype: str | None, model_dtype: str | None = "bfloat16", unknown: int | None = None) -> int:
    """Bytes per element of ``dtype`` (``auto`` or None: ``model_dtype``'s) from :data:`DTYPE_BYTES`; a name it
    does not hold is ``unknown`` bytes (None: ValueError)."""
    name = _dtype(model_dtype if dtype in (None, "auto") else dtype)
    if name not in DTYPE_BYTES and unknown is None:
        raise ValueError(f"unknown dtype {dtype!r} (model {model_dtype!r})")
    return DTYPE_BYTES.get(name, unknown)


# -- KV cache ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVPlan:
    """vLLM's KV cache groups for one shape and flags: every block id of the shared pool is
    ``bytes_per_block`` (the largest group's pages), and one request at ``max_model_len`` takes
    ``blocks_per_request`` of them over all groups (``get_max_concurrency_for_kv_cache_config``)."""

    block_size: int  # attention tokens per block (hybrids raise it so a page holds a linear state)
    page_bytes: int  # one layer's page
    groups: tuple[tuple[str, int], ...]  # (kind, groups of that kind)
    bytes_per_block: int
    blocks_per_request: int | None  # None without max_model_len


def _mamba_page(shape: ModelShape) -> int:
    """One linear-attention layer's state (``gated_delta_net_state_shape``, dtype the model's: vLLM's
    ``mamba_cache_dtype`` ``auto``): a conv state of ``kernel - 1`` rows and a ``v_heads x v_dim x k_dim``
    recurrent state, each sharded by TP."""
    s, tp = shape, shape.tensor_parallel
    conv = (s.linear_key_head_dim * s.linear_key_heads * 2 + s.linear_value_head_dim * s.linear_value_heads) // tp
    recurrent = s.linear_value_heads // tp * s.linear_value_head_dim * s.linear_key_head_dim
    return (conv * (s.linear_conv_kernel - 1) + recurrent) * dtype_bytes(None, s.dtype)


def kv_plan(shape: ModelShape, kv_cache_dtype: str | None = None, block_size: int | None = None) -> KVPlan:
    """Groups and bytes per block as vLLM 0.34 plans them (flags default to the shape's; ``block_size`` is the
    one vLLM picked for the attention backend, 64 on the H200 traces; a hybrid's trace records the raised one,
    which gives the same plan).

    - A layer's page: ``block_size x kv_heads/TP x 2 x head_dim x dtype`` (``AttentionSpec.page_size_bytes``).
    - Hybrids with linear attention: the block grows to ``block x cdiv(state, block x per-token)`` tokens so
      an attention page holds a state, and the state is padded to that page (``_align_hybrid_block_size``).
    - One kind of layer: one group of all layers. Several: the smallest kind's count is the group size (the
      largest when under 1.5x the smallest) and each kind splits into ``cdiv(count, size)`` groups
      (``_get_kv_cache_groups_uniform_page_size``); a block is one group's pages (``_get_kv_cache_bytes_per_block``)."""
    kv_cache_dtype = kv_cache_dtype or shape.kv_cache_dtype
    block = block_size or shape.block_size
    _need(shape, "kv_heads", "head_dim", "full_layers", "dtype")
    if block is None or kv_cache_dtype is None:
        raise ValueError("the KV cache needs kv_cache_dtype and block_size (vllm.config)")
    kv_heads = max(1, shape.kv_heads // shape.tensor_parallel)  # replicated below one a rank
    per_token = kv_heads * 2 * shape.head_dim * dtype_bytes(kv_cache_dtype, shape.dtype)
    if shape.linear_layers:
        _need(shape, *_LINEAR_DIMS)
        block = max(block, block * math.ceil(_mamba_page(shape) / (block * per_token)))
    kinds = [(k, n) for k, n in (("full", shape.full_layers), ("sliding", shape.sliding_layers), ("linear", shape.linear_layers)) if n]  # fmt: skip
    size = min(n for _, n in kinds)
    if max(n for _, n in kinds) < size * 1.5:
        size = max(n for _, n in kinds)
    groups = tuple((k, math.ceil(n / size)) for k, n in kinds)
    page = block * per_token
    per_request = None
    if shape.max_model_len:
        per = {"full": math.ceil(shape.max_model_len / block), "linear": MAMBA_BLOCKS_PER_REQUEST}
        if shape.sliding_layers:
            _need(shape, "sliding_window", "max_num_batched_tokens")
            in_flight = CONCURRENT_BATCHES * shape.max_num_batched_tokens
            held = min(shape.sliding_window - 1 + in_flight, shape.max_model_len)
            per["sliding"] = math.ceil(held / block) + 1  # SlidingWindowSpec.max_admission_blocks_per_request
        per_request = sum(per[k] * n for k, n in groups)
    return KVPlan(block, page, groups, size * page, per_request)


def kv_bytes_for_tokens(shape: ModelShape, tokens: int) -> int:
    """The KV cache vLLM would report as ``tokens`` ("GPU KV cache size: N tokens" = blocks / blocks per
    request x max_model_len): the blocks that takes, in bytes. One request: ``tokens = max_model_len``."""
    plan = kv_plan(shape)
    _need(shape, "max_model_len")
    return math.ceil(tokens * plan.blocks_per_request / shape.max_model_len) * plan.bytes_per_block


def kv_cache_for_bytes(shape: ModelShape, available: int) -> tuple[int, int]:
    """(blocks, tokens) vLLM sizes from ``available`` bytes: ``available // bytes_per_block`` blocks
    (``get_kv_cache_config_from_groups``), ``int(blocks / per_request x max_model_len)`` tokens
    (``get_kv_cache_capacity``)."""
    plan = kv_plan(shape)
    _need(shape, "max_model_len")
    blocks = max(available, 0) // plan.bytes_per_block
    return blocks, int(blocks / plan.blocks_per_request * shape.max_model_len)


# -- weights ----------------------------------------------------------------------------------------------


def parameters(shape: ModelShape) -> int:
    """Parameters one TP rank holds in vLLM's layers: vocabulary padded to 64, q/k/v/o, MLP or experts,
    linear-attention projections and the vocabulary sharded by TP (KV heads replicated below one per rank);
    norms and the router whole. Families: Llama/Mistral/Qwen3 dense, Qwen3-MoE (every layer MoE), Gemma3
    (4 norms a layer, tied embeddings), Qwen3-Next / Qwen3.5-MoE (gated q, shared expert, GatedDeltaNet)."""
    s, tp = shape, shape.tensor_parallel
    _need(s, "vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "full_layers")
    h, mt = s.hidden, s.model_type or ""
    vocab = -(-s.vocab // VOCAB_PADDING) * VOCAB_PADDING // tp
    total = vocab * h * (1 if s.tie_word_embeddings else 2) + h  # + the final norm
    q = s.heads // tp * s.head_dim
    attn = h * q * (2 if mt.startswith(_GATED_Q) else 1) + 2 * h * max(1, s.kv_heads // tp) * s.head_dim + q * h
    attn += 2 * s.head_dim if mt.startswith(_QK_NORM) else 0
    if s.experts:
        _need(s, "moe_intermediate")
        mlp = h * s.experts + s.experts * 3 * h * s.moe_intermediate // tp
        mlp += 3 * h * s.shared_expert_intermediate // tp + (h if s.shared_expert_intermediate else 0)
    else:
        _need(s, "intermediate")
        mlp = 3 * h * s.intermediate // tp
    total += s.layers * (mlp + (4 if mt.startswith("gemma") else 2) * h)
    total += (s.full_layers + s.sliding_layers) * attn
    if s.linear_layers:
        kd, vd = s.linear_key_heads * s.linear_key_head_dim, s.linear_value_heads * s.linear_value_head_dim
        gdn = h * (2 * kd + 2 * vd) + h * 2 * s.linear_value_heads + (2 * kd + vd) * s.linear_conv_kernel
        gdn = (gdn + 2 * s.linear_value_heads + vd * h) // tp + s.linear_value_head_dim
        total += s.linear_layers * gdn
    return total


def lm_head_example_bytes(shape: ModelShape) -> int:
    """A cold torch.compile's autotuning example of the LM head GEMM (Inductor's ``select_algorithm.py``
    ``generate_example_value``): the padded vocabulary x hidden in the model's dtype, tied embeddings or not. Every
    cold compile of issue 43's compiled architectures allocated it in profile_run (Gemma3 1,342,504,960 B; the
    Llama-shaped model 1,050,673,152 B; Qwen3-MoE 622,329,856 B), and two died asking for it. 0 without the shape."""
    if not shape.vocab or not shape.hidden:
        return 0
    vocab = -(-shape.vocab // VOCAB_PADDING) * VOCAB_PADDING
    return vocab * shape.hidden * dtype_bytes(shape.dtype, unknown=2)


def rotary_cache_bytes(shape: ModelShape) -> int:
    """vLLM's rotary ``cos_sin_cache`` buffers (``max_position x rotary_dim`` in the model's dtype; one per
    distinct rope: Gemma3 has a local and a global one)."""
    _need(shape, "max_position", "rotary_dim", "dtype")
    ropes = 2 if shape.sliding_layers and (shape.model_type or "").startswith("gemma3") else 1
    return ropes * shape.max_position * shape.rotary_dim * dtype_bytes(None, shape.dtype)


def weights_bytes(shape: ModelShape) -> int:
    """What vLLM's "Model loading took" counts on one rank: the parameters in the model's dtype and the
    rotary cache."""
    _need(shape, "dtype")
    return parameters(shape) * dtype_bytes(None, shape.dtype) + rotary_cache_bytes(shape)


def weights_from_safetensors(folder: str | Path) -> int:
    """Bytes of every tensor in the ``*.safetensors`` files of ``folder``, from their headers alone (8-byte
    little-endian length, then JSON: each tensor's dtype, shape and byte range); the tensors are not read."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise UsageError(f"{folder}: no *.safetensors file; give the checkpoint's folder")
    total = 0
    for path in files:
        total += sum(_tensor_bytes(path, name, meta) for name, meta in _header(path).items() if name != "__metadata__")
    return total


def _header(path: Path) -> dict:
    try:
        with path.open("rb") as fh:
            raw = fh.read(8)
            size = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            if not 0 < size <= path.stat().st_size - 8:
                raise ValueError(f"header length {size} does not fit the file")
            header = json.loads(fh.read(size))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        return header
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable safetensors file ({exc}); re-download the checkpoint") from None


def _tensor_bytes(path: Path, name: str, meta: Any) -> int:
    try:
        begin, end = meta["data_offsets"]
        bits = _ST_BITS[meta["dtype"]] * math.prod(meta["shape"])
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"{path}: tensor {name!r} has no dtype, shape and data_offsets; re-download it") from None
    if end - begin != -(-bits // 8):
        raise UsageError(f"{path}: tensor {name!r} spans {end - begin} bytes, not its dtype x shape; re-download it")
    return end - begin
