"""The capacity what-if for vLLM 0.34's extensible KV cache: on another card, where would the start-up die,
and otherwise how many KV blocks and tokens would it get?

The profiling model of :mod:`.fits` (KV = ``ceil(util x capacity) - non_kv``) does not hold when vLLM sizes
the KV cache after warm-up (``facts["vllm.kv_cache_size_source"] == "extensible"``). Here:

1. **Before the KV cache is extended** the start-up needs, at each moment, what :func:`.fits.need_curve`
   says (PyTorch's pinned segments + non-PyTorch memory) plus the KV pages committed when the cache was
   created (``kv_cache_init``: the null block(s); vLLM commits at least those on any card). The blocks
   warm-up commits beyond them are bounded by what is free (``committable_blocks``), so they shrink with
   the card and are not counted. The card dies (OOM) in the first phase where that need, plus what other
   processes hold, goes over the card.
2. **The address range** is sized by ``determine_available_memory`` as before (``requested - non_kv``,
   :func:`.reconcile.non_kv`); vLLM refuses ("No available memory for the cache blocks") when it is not
   positive or cannot hold one request of ``max_model_len`` tokens.
3. **The size** comes from vLLM's post-warm-up formula (:func:`.extensible.measure_kv_cache_bytes`) with
   the inputs vLLM measured on the recorded card, moved to the other card: free memory and init-time free
   memory less the bytes the card lacks (and less what other processes hold), ``requested = ceil(util x
   capacity)``; the transient peak, PyTorch's reserve growth and the committed null blocks do not depend on
   the card. vLLM refuses after warm-up when the blocks (less the null block) cannot hold one request.
4. Tokens: the recorded tokens per block.

``util``: the recording's when the user set it, else vLLM 0.34's default with the extensible KV cache (1.0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from memtrace import facts as F
from memtrace.analysis.analysed.landmarks import landmarks
from memtrace.analysis.capacity.extensible import blocks_within, extensible_sizing, measure_kv_cache_bytes, pages_for
from memtrace.analysis.capacity.fits import (
    FITS,
    MIN_CAPACITY,
    NO_KV,
    OOM,
    UNKNOWN,
    Fit,
    Recorded,
    need_curve,
    search_ceiling,
    smallest_card,
)
from memtrace.analysis.capacity.reconcile import non_kv as non_kv_model
from memtrace.analysis.capacity.whatif import recorded_others
from memtrace.analysis.memory.curves import Curves, all_curves, committed_curve
from memtrace.analysis.memory.phases import path_at
from memtrace.analysis.memory.quantities import first_max
from memtrace.model import Trace

#: vLLM 0.34's default utilization with the extensible KV cache.
EXTENSIBLE_DEFAULT_UTIL = 1.0
NO_KV_AFTER_WARMUP = "no-kv-memory-after-warm-up"


@dataclass(frozen=True)
class ExtensibleFit:
    """The prediction for one card (bytes; blocks and tokens as vLLM counts them)."""

    capacity_bytes: int
    others_bytes: int  # held on the card by other processes
    util: float
    requested_bytes: int
    outcome: str  # FITS, OOM, NO_KV (at kv_cache_init), NO_KV_AFTER_WARMUP, UNKNOWN
    phase: str  # where it dies ("" when it fits)
    time_us: int | None  # when (the recorded moment of the first crossing)
    pre_kv_peak_bytes: int  # the most the start-up needs before the KV cache is extended (others included)
    pre_kv_peak_phase: str
    range_bytes: int | None  # the address range's budget: requested - non_kv
    available_bytes: int | None  # vLLM's post-warm-up figure on this card
    kv_blocks: int | None
    kv_tokens: int | None
    kv_bytes: int | None  # the pages the extension commits
    notes: list[str] = field(default_factory=list)

    @property
    def survives(self) -> bool:
        return self.outcome == FITS


def is_extensible(trace: Trace) -> bool:
    """Whether vLLM sized this trace's KV cache after warm-up (0.34's extensible KV cache)."""
    return trace.facts.get(F.VLLM_KV_SIZE_SOURCE) == F.KV_SIZED_EXTENSIBLE


def fit_extensible(
    trace: Trace,
    capacity_bytes: int,
    util: float | None = None,
    *,
    others_bytes: int = 0,
    non_torch_bytes: int | None = None,
    curves: Curves | None = None,
) -> ExtensibleFit | None:
    """The prediction for a card of ``capacity_bytes`` (CUDA's total) of which other processes hold
    ``others_bytes``; None for a trace whose KV cache was not sized after warm-up."""
    sizing = extensible_sizing(trace, curves)
    if not is_extensible(trace) or sizing is None:
        return None
    curves = curves or all_curves(trace)
    facts = trace.facts
    notes: list[str] = []
    if util is None:
        user = facts.get(F.UTIL_SOURCE) == "user"
        util = float(facts.get(F.UTIL)) if user and facts.get(F.UTIL) else EXTENSIBLE_DEFAULT_UTIL
    recorded_total = sizing.term("free").vllm_bytes and (
        (facts.get(F.VLLM_KV_SIZING) or {}).get("total_memory_bytes") or trace.process.device_total_bytes
    )
    if not recorded_total:
        return None
    # bytes this card has less of, free: the recorded card's other processes are not on it (unless given back
    # as ``others_bytes``, ``--keep-others``)
    left_out = recorded_others(trace)
    lacks = int(recorded_total) - left_out - capacity_bytes + others_bytes
    requested = math.ceil(capacity_bytes * util)
    # 1. before the KV cache is extended
    extend = next((p for p in trace.phases if p.name == "kv_cache_extend"), None)
    init = next((p for p in trace.phases if p.name == "kv_cache_init" and p.end_us), None)
    end = extend.start_us if extend is not None else sizing.time_us
    lm = landmarks(trace, curves)
    need = need_curve(trace, curves, lm, non_torch_bytes)
    floor = committed_curve(trace, kv_cache_only=True).at(init.end_us) if init is not None else 0
    window = need.window(need.time_us[0] if len(need) else 0, end)
    after_init = window.time_us >= (init.end_us if init is not None else end)
    need_b = window.bytes + others_bytes + (after_init * floor)
    i = max(first_max(need_b), 0)
    peak, peak_t = (int(need_b[i]), int(window.time_us[i])) if len(need_b) else (0, end)
    common = dict(capacity_bytes=capacity_bytes, others_bytes=others_bytes, util=util, requested_bytes=requested)
    pre = dict(pre_kv_peak_bytes=peak, pre_kv_peak_phase=path_at(trace, peak_t))
    over = [j for j, b in enumerate(need_b) if b > capacity_bytes]
    if over:
        t = int(window.time_us[over[0]])
        return ExtensibleFit(
            **common,
            outcome=OOM,
            phase=path_at(trace, t),
            time_us=t,
            **pre,
            range_bytes=None,
            available_bytes=None,
            kv_blocks=None,
            kv_tokens=None,
            kv_bytes=None,
            notes=notes,
        )
    # 2. the address range
    nk = non_kv_model(trace, curves)
    range_bytes = requested - nk.bytes if nk is not None else None
    one = _one_request_bytes(trace, sizing)
    empty = dict(
        available_bytes=None,
        kv_blocks=None,
        kv_tokens=None,
        kv_bytes=None,
    )
    if range_bytes is not None and (range_bytes <= 0 or (one is not None and range_bytes < one)):
        return ExtensibleFit(
            **common,
            outcome=NO_KV,
            phase="kv_cache_init",
            time_us=init.start_us if init else None,
            **pre,
            range_bytes=range_bytes,
            **empty,
            notes=notes,
        )
    # 3. the size, by vLLM's formula on this card
    s = facts.get(F.VLLM_KV_SIZING) or {}
    strides = [int(x) for x in s.get("segment_strides") or []]
    granule = int(s.get("granularity_bytes") or 0)
    available, *_ = measure_kv_cache_bytes(
        init_free=int(s["init_free_memory_bytes"]) - lacks,
        free=int(s["free_memory_bytes"]) - lacks,
        committed=int(s["committed_bytes"]),
        requested=requested,
        transient_peak=int(s["transient_peak_bytes"]),
        torch_reserve_growth=int(s["torch_reserve_growth_bytes"]),
        margin_floor=int(s.get("margin_floor_bytes") or 1 << 30),
        margin_fraction=float(s.get("margin_fraction") or 0.75),
    )
    capacity_blocks = (
        range_bytes // sizing.bytes_per_block if range_bytes is not None else int(s.get("capacity_blocks") or 0)
    )
    blocks = blocks_within(available, strides, granule, capacity_blocks) if strides and granule else 0
    tokens_per_block = F.kv_tokens_per_block(trace.facts)
    sized = dict(
        available_bytes=available,
        kv_blocks=blocks,
        kv_tokens=blocks * tokens_per_block if tokens_per_block else None,
        kv_bytes=pages_for(blocks, strides, granule) if strides and granule else None,
    )
    if blocks <= 1 or (one is not None and (blocks - 1) * sizing.bytes_per_block < one):
        t = sizing.time_us
        return ExtensibleFit(
            **common,
            outcome=NO_KV_AFTER_WARMUP,
            phase=path_at(trace, t),
            time_us=t,
            **pre,
            range_bytes=range_bytes,
            **sized,
            notes=notes,
        )
    outcome = FITS if extend is not None else UNKNOWN
    if extend is None:
        notes.append("the recording ends before the KV cache was extended")
    return ExtensibleFit(
        **common, outcome=outcome, phase="", time_us=None, **pre, range_bytes=range_bytes, **sized, notes=notes
    )


def _one_request_bytes(trace: Trace, sizing) -> int | None:
    """KV bytes one request of max_model_len tokens needs: blocks of the recorded tokens per block."""
    per_block = F.kv_tokens_per_block(trace.facts)
    max_len = (trace.facts.get(F.VLLM_CONFIG) or {}).get("max_model_len")
    if not per_block or not isinstance(max_len, int):
        return None
    return math.ceil(max_len / per_block) * sizing.bytes_per_block


def as_fit(rank, capacity_bytes: int, util: float | None, rec: Recorded) -> Fit:
    """:func:`fit_extensible` as a ``fits.Fit``: the same outcomes, words and JSON as the
    profiling model, with the blocks and tokens vLLM would commit after warm-up."""
    e = fit_extensible(rank.trace, capacity_bytes, util, non_torch_bytes=rec.non_torch_bytes, curves=rank.curves)
    outcome = NO_KV if e.outcome == NO_KV_AFTER_WARMUP else e.outcome
    over = {OOM: e.pre_kv_peak_bytes - capacity_bytes, NO_KV: -(e.range_bytes or 0) if e.outcome == NO_KV else 0}
    stage = {OOM: "pre-KV", NO_KV: "KV sizing"}.get(outcome, "")
    return Fit(
        capacity_bytes=capacity_bytes,
        util=e.util,
        target_bytes=e.requested_bytes,
        non_kv_bytes=rec.non_kv_bytes,
        kv_cache_bytes=e.kv_bytes or 0,
        pre_kv_peak_bytes=e.pre_kv_peak_bytes,
        pre_kv_peak_phase=e.pre_kv_peak_phase,
        post_kv_peak_bytes=None,
        post_kv_peak_phase="",
        outcome=outcome,
        phase=e.phase,
        overshoot_bytes=max(over.get(outcome, 0), 0),
        headroom_bytes=capacity_bytes - e.pre_kv_peak_bytes if outcome == FITS else 0,
        stage=stage,
        non_torch_bytes=rec.non_torch_bytes,
        non_torch_source=rec.non_torch_source,
        non_kv_source=rec.non_kv_source,
        recorded_capacity_bytes=rec.capacity_bytes,
        kv_sizing=F.KV_SIZED_EXTENSIBLE,
        kv_blocks=e.kv_blocks,
        kv_tokens=e.kv_tokens,
        others_left_out_bytes=recorded_others(rank.trace),
        **rec.non_torch_split,
    )


def smallest(rank, util: float | None, rec: Recorded, lo: int = MIN_CAPACITY) -> int | None:
    """The smallest capacity (to 64 MiB) on which :func:`as_fit` survives, or None up to ``fits.search_ceiling``."""
    return smallest_card(lambda c: as_fit(rank, c, util, rec).survives, lo, search_ceiling(rec, lo))
