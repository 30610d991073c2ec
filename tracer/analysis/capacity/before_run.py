"""Will it boot, before any run: the start-up put together from the model's config and the priors (issue 43).

``memtrace fits --config config.json --capacity 16GiB [--what-if ...] [--suggest]``: the weights from the
checkpoint's safetensors headers when the config's folder holds them (exact), else from the config's shape (said
so); the CUDA context, activations, sampler, warm-up, graphs and vLLM's sizing inputs from the priors
(:mod:`.priors`); the KV cache by vLLM's own formula (:func:`.whatif.carried_outcome`). The flags are vLLM 0.34's
defaults for ``vllm serve`` on that card (:func:`serve_defaults`), changed by ``--what-if``. A recording of the
same model replaces the priors: ``memtrace fits RUN``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from memtrace.analysis.capacity import priors as P
from memtrace.analysis.capacity import shape as S
from memtrace.analysis.capacity import whatif as W

GiB = 1 << 30
#: vLLM 0.34's defaults for ``vllm serve`` (``EngineArgs.get_batch_defaults``, OPENAI_API_SERVER) by the card's
#: memory: (at least bytes, max-num-batched-tokens, max-num-seqs), largest first (an A100 or GB10 of >= 70 GiB
#: takes the last row; not told apart here)
SERVE_DEFAULTS = ((160 * GiB, 16384, 1024), (70 * GiB, 8192, 1024), (0, 2048, 256))
#: the block size the predictions count one request's blocks in (vLLM's bytes per token do not depend on it)
BLOCK_TOKENS = 16


def serve_defaults(capacity: int) -> tuple[int, int]:
    """(max-num-batched-tokens, max-num-seqs) vLLM 0.34's ``vllm serve`` takes on a card of ``capacity`` bytes."""
    return next((t, s) for least, t, s in SERVE_DEFAULTS if capacity >= least)


def config_flags(shape: dict, capacity: int, what_if: list[str]) -> W.Flags:
    """vLLM 0.34's default flags for this model on this card, changed by ``what_if``."""
    tokens, seqs = serve_defaults(capacity)
    max_len = int(shape.get("max_position_embeddings") or 0) or 8192
    base = W.Flags(max_num_batched_tokens=tokens, max_num_seqs=seqs, max_model_len=max_len, enforce_eager=False,
                   kv_cache_dtype="auto", gpu_memory_utilization=None, extensible=True)  # fmt: skip
    return W.apply_what_if(base, what_if)


@dataclass(frozen=True)
class Weights:
    """The weights' bytes and where they come from (the checkpoint's headers, or the config's shape)."""

    bytes: int
    source: str


def weights_of(config_path: str) -> Weights:
    """The checkpoint's safetensors headers beside ``config_path`` when there are any, else the config's shape."""
    folder = Path(config_path) if Path(config_path).is_dir() else Path(config_path).parent
    if any(folder.glob("*.safetensors")):
        return Weights(S.weights_from_safetensors(folder), f"the safetensors headers in {folder}")
    m = S.ModelShape.from_config(config_path)
    flags = ("kv_cache_dtype", "block_size", "max_model_len", "max_num_batched_tokens", "vision_weights")
    lacking = [x for x in m.missing() if x not in flags]
    if lacking:
        raise S.config_error(config_path, f"the config lacks {', '.join(lacking)}, which the weights are counted from")
    return Weights(S.weights_bytes(m), "the config's shape (no checkpoint beside it)")


def predict(
    shape: dict, flags: W.Flags, capacity: int, weights: Weights, library: P.Library, others: int = 0
) -> W.Outcome:
    """The answer on ``capacity`` with nothing recorded: every figure but the weights from the priors."""
    given = {P.WEIGHTS: P.Figure(P.WEIGHTS, weights.bytes, weights.source)}
    c = P.Carried(shape, flags, library, given)
    try:
        return W.carried_outcome(c, capacity, others, W.kv_shape(shape, flags, BLOCK_TOKENS))
    except ValueError as e:
        raise S.config_error(shape.get("source", "the config"), str(e)) from None


def suggest(shape: dict, flags: W.Flags, capacity: int, weights: Weights, library: P.Library, others: int = 0,
            top: int = 8) -> list[W.Suggestion]:  # fmt: skip
    """The single changes (else pairs, else three at once) to ``flags`` that boot with nothing recorded: fewest
    changes first, then clear of the priors' spread, then the most KV cache."""
    # nothing recorded to scale: each answer is cheap, so three changes at once too
    found, _ = W.search(flags, W.candidates(flags, True), 3,
                        lambda f: predict(shape, f, capacity, weights, library, others), (W.BOOTS,))  # fmt: skip
    found.sort(
        key=lambda s: (len(s.changes), not W.clear_of_spread(s.outcome), -(s.outcome.kv.tokens if s.outcome.kv else 0))
    )
    return found[:top]
