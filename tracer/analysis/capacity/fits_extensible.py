"""The capacity what-if for vLLM 0.34's extensible KV cache: on another card, where would the start-up die,
and otherwise how many KV blocks and tokens would it get?

The profiling model of :mod:`.fits` (KV = ``ceil(util x capacity) - non_kv``) does not hold when vLLM sizes
the KV cache after warm-up (``facts["vllm.kv_cache_size_source"] == "extensible"``). Here:

1. **Before the KV cache is extended** the start-up needs, at each moment, what :func:`.whatif.need_curve`
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
from dataclasses import dataclass

import numpy as np
from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.analysis.capacity.extensible import (
    ExtensibleSizing,
    blocks_within,
    extensible_inputs,
    measure_kv_cache_bytes,
    pages_for,
)
from memtrace.analysis.capacity.fits import FITS, NO_KV, OOM, UNKNOWN, Fit, Recorded, recorded
from memtrace.analysis.capacity.reconcile import profiled_kv_bytes
from memtrace.analysis.capacity.whatif import (
    recorded_one_request,
    recorded_util,
)
from memtrace.analysis.memory.curves import committed_curve
from memtrace.analysis.memory.phases import path_at
from memtrace.analysis.memory.quantities import first_max
from memtrace.model import Trace


def is_extensible(trace: Trace) -> bool:
    """Whether vLLM sized this trace's KV cache after warm-up (0.34's extensible KV cache)."""
    return trace.facts.get(F.VLLM_KV_SIZE_SOURCE) == F.KV_SIZED_EXTENSIBLE


@dataclass(frozen=True)
class Prepared:
    """What :func:`fit_extensible` needs on any card, computed once (step 1's need, step 2's non-KV figure)."""

    sizing: ExtensibleSizing
    recorded_total: int
    time_us: np.ndarray  # the need before the KV cache is extended: its times and bytes (the null blocks in)
    need: np.ndarray
    peak_bytes: int
    peak_phase: str
    extended: bool
    init_us: int | None
    non_kv_bytes: int | None
    one_request: int | None


def prepare(rank, rec: Recorded) -> Prepared | None:
    """The card-independent part of :func:`fit_extensible` from what the analysed ``rank`` and ``rec``
    (``fits.recorded``) already hold: the sizing, what the start-up needs, the non-KV figure; None for a trace whose
    KV cache was not sized after warm-up."""
    trace, sizing = rank.trace, rank.extensible
    if not is_extensible(trace) or sizing is None:
        return None
    total = sizing.term("free").vllm_bytes and (
        (trace.facts.get(F.VLLM_KV_SIZING) or {}).get("total_memory_bytes") or trace.process.device_total_bytes
    )
    if not total:
        return None
    extend = next((p for p in trace.phases if p.name == PN.KV_CACHE_EXTEND), None)
    init = next((p for p in trace.phases if p.name == PN.KV_CACHE_INIT and p.end_us), None)
    end = extend.start_us if extend is not None else sizing.time_us
    floor = committed_curve(trace, kv_cache_only=True).at(init.end_us) if init is not None else 0
    window = rec.need.window(rec.need.time_us[0] if len(rec.need) else 0, end)
    need_b = window.bytes + (window.time_us >= (init.end_us if init is not None else end)) * floor
    i = max(first_max(need_b), 0)
    peak, peak_t = (int(need_b[i]), int(window.time_us[i])) if len(need_b) else (0, end)
    return Prepared(sizing, int(total), window.time_us, need_b.astype(np.int64), peak, path_at(trace, peak_t),
                    extend is not None, init.start_us if init else None,
                    rec.non_kv_bytes if rec.non_kv_source else None, recorded_one_request(trace.facts))  # fmt: skip


def fit_extensible(rank, capacity_bytes: int, util: float | None = None, *, others_bytes: int = 0,
                   prep: Prepared | None = None, rec: Recorded | None = None) -> Fit | None:  # fmt: skip
    """The prediction for the analysed ``rank`` on a card of ``capacity_bytes`` (CUDA's total) of which other
    processes hold ``others_bytes``; None for a trace whose KV cache was not sized after warm-up (``rec``:
    ``fits.recorded``, ``prep``: :func:`prepare`, to share the work between cards)."""
    rec = rec or recorded(rank.trace, rank=rank)
    prep = prep or prepare(rank, rec)
    if prep is None:
        return None
    trace, facts = rank.trace, rank.trace.facts
    util = recorded_util(trace) if util is None else util
    requested, pre = math.ceil(capacity_bytes * util), prep.peak_bytes + others_bytes

    def result(outcome, phase="", over=0, stage="KV sizing", blocks=None, kv=0):
        tpb = F.kv_tokens_per_block(facts)
        return Fit(capacity_bytes, util, requested, rec.non_kv_bytes, kv, pre, prep.peak_phase, None, "", outcome,
                   phase, max(over, 0), capacity_bytes - pre if outcome == FITS else 0, stage, rec.non_torch_bytes,
                   rec.non_torch_source, rec.non_kv_source, None, rec.capacity_bytes, **rec.non_torch_split,
                   kv_sizing=F.KV_SIZED_EXTENSIBLE, kv_blocks=blocks, kv_tokens=blocks * tpb if blocks and tpb else None,
                   others_left_out_bytes=rec.others_bytes)  # fmt: skip

    # 1. before the KV cache is extended
    over = np.flatnonzero(prep.need + others_bytes > capacity_bytes)
    if len(over):
        return result(OOM, path_at(trace, int(prep.time_us[over[0]])), pre - capacity_bytes, "pre-KV")
    # 2. the address range
    one = prep.one_request
    rng = profiled_kv_bytes(util, capacity_bytes, prep.non_kv_bytes) if prep.non_kv_bytes is not None else None
    if rng is not None and (rng <= 0 or (one is not None and rng < one)):
        return result(NO_KV, PN.KV_CACHE_INIT, -rng)
    # 3. the size, by vLLM's formula on this card: the bytes this card has less of, free (the recorded card's other
    # processes are not on it, unless given back as ``others_bytes``)
    lacks = prep.recorded_total - rec.others_bytes - capacity_bytes + others_bytes
    s = facts.get(F.VLLM_KV_SIZING) or {}
    strides, granule = [int(x) for x in s.get("segment_strides") or []], int(s.get("granularity_bytes") or 0)
    available, *_ = measure_kv_cache_bytes(requested=requested, **extensible_inputs(s, lacks))
    bpb = prep.sizing.bytes_per_block
    most = rng // bpb if rng is not None else int(s.get("capacity_blocks") or 0)
    blocks = blocks_within(available, strides, granule, most) if strides and granule else 0
    if blocks <= 1 or (one is not None and (blocks - 1) * bpb < one):  # the null block holds no request
        return result(NO_KV, path_at(trace, prep.sizing.time_us))
    kv = pages_for(blocks, strides, granule)
    return result(FITS if prep.extended else UNKNOWN, stage="", blocks=blocks, kv=kv)
