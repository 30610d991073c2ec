"""The capacity model: would this start-up survive on a card of another size, and where would it die?

vLLM's own sizing, applied to a recorded start-up:

1. What does not depend on the card stays as recorded (weights, workspaces, ``profile_run``'s activations, the
   CUDA context and other non-PyTorch memory): the curve *before* the KV cache is the same on any card. The curve
   is what the start-up *needs* (:func:`.whatif.need_curve`: pinned segments plus non-PyTorch memory, as recorded
   or as given by ``--non-torch``; with CUPTI records the assumed figure is split by ``non_torch.breakdown``).
2. vLLM sizes the KV cache as ``ceil(util x capacity) - non_kv`` (``reconcile.non_kv``, the figure ``report``
   shows); a size given to vLLM (``--kv-cache-memory-bytes``, a start-up plan) is the same on any card.
3. It dies (OOM) in the first phase where the pre-KV curve goes over the physical card (``util`` cannot help).
   Before that, vLLM refuses at ``init_device`` when the free memory then is below ``util x capacity`` (not
   with 0.34's extensible KV cache).
4. It refuses ("No available memory for the cache blocks") when ``KV <= 0`` or it cannot hold one request of
   ``max_model_len`` tokens.
5. After the KV cache exists the recorded curve moves by ``KV(capacity) - KV(recorded)``; it dies in the first
   phase where that goes over the card.

A recording that ended in an OOM covers the start-up only up to that failed request: a death found before it is
answered as usual; else the failed request is added at its moment, and the answer is DIED (it dies where the
recording died) when that goes over the card or the card has no more room there than the recorded one had (so the
recorded card always answers DIED), NO_KV when vLLM's KV sizing already refuses on the part recorded, else UNKNOWN
("beyond the recording"). A vLLM recording that ended before the KV cache was sized answers UNKNOWN past it too
(``analysis.boot`` then asks the what-if model); a program that is not vLLM fits when its whole curve does.

vLLM 0.34's extensible KV cache (:func:`fit_extensible`): before the cache is extended the start-up needs the curve
plus the null block(s) committed in ``kv_cache_init``; the address range is sized as in 2 (refused as in 4); the
size is vLLM's post-warm-up formula (:func:`.extensible.sized`) on its recorded inputs moved to this card (free
memory less the bytes the card lacks, ``requested = ceil(util x capacity)``), refused when the blocks less the null
block cannot hold one request. Pure functions over a Trace; figures are bytes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.analysis.analysed.landmarks import Landmarks, steady_non_torch_at
from memtrace.analysis.capacity import whatif as W
from memtrace.analysis.capacity.extensible import ExtensibleSizing, address_range, extensible_inputs, null_blocks, sized
from memtrace.analysis.capacity.reconcile import KV_GIVEN, MEMTRACE, profiled_kv_bytes
from memtrace.analysis.memory import non_torch
from memtrace.analysis.memory.curves import Curve
from memtrace.analysis.memory.oom import Oom
from memtrace.analysis.memory.phases import path_at
from memtrace.analysis.memory.quantities import first_max, window_peak
from memtrace.model import Trace

FITS = "fits"
OOM = "oom"
NO_KV = "no-kv-memory"
UNKNOWN = "unknown"  # the recording ends (the run died) before the part that decides
REFUSED = "refused-at-init"  # vLLM: free memory at init_device is less than util × capacity
DIED = "died"  # the recording died of OOM, and this card has no more room there: it dies there too
#: The one verdict every output gives (``whatif``'s words): each outcome's, the outcome saying why.
VERDICT = {FITS: W.BOOTS, OOM: W.DIES, DIED: W.DIES, NO_KV: W.REFUSES, REFUSED: W.REFUSES, UNKNOWN: W.UNKNOWN}
#: The smallest card ``fits`` accepts (no GPU vLLM runs on has less), and the precision of the smallest-card search
#: (``boot.smallest_card``; a smallest card within it of MIN_CAPACITY is the floor).
MIN_CAPACITY, SEARCH_STEP = 1 << 30, 64 << 20
NO_KV_CACHE = "no KV cache"  # the stage of a program that sizes none (not vLLM): its whole curve fits
#: Why vLLM's KV check refuses (``Fit.stage``; at ``PN.KV_SIZING_CHECK`` both, or after the extensible cache's warm-up):
#: no memory at all is plain "KV sizing"; these two hold some, but not one request of max_model_len tokens
ONE_REQUEST = "KV sizing: one request"  # the profiled cache
ADDRESS_RANGE = "KV sizing: address range"  # 0.34's extensible cache, its reserved range


#: Where the assumed non-PyTorch memory came from.
NT_ARGUMENT = "--non-torch"
NT_AT_SIZING = "NVML at KV sizing"
NT_LAST_STEADY = "NVML, last steady sample"
NT_NONE = "none (no NVML samples)"


@dataclass(frozen=True)
class Fit:
    """The prediction for one capacity."""

    capacity_bytes: int
    util: float
    target_bytes: int  # ceil(util × capacity): what vLLM may fill
    non_kv_bytes: int  # what vLLM counts as not KV cache (card-independent)
    kv_cache_bytes: int  # what vLLM would allocate for the KV cache (0 where it never gets there: it refuses or dies)
    pre_kv_peak_bytes: int
    pre_kv_peak_phase: str
    post_kv_peak_bytes: int | None  # None when the run would not get that far or the trace lacks it
    post_kv_peak_phase: str
    outcome: str  # FITS, OOM, NO_KV, REFUSED or UNKNOWN
    phase: str  # where it dies ("" when it fits)
    overshoot_bytes: int  # by how much it goes over the capacity (OOM), or the KV bytes short of one request (NO_KV)
    headroom_bytes: int  # the smallest gap under the capacity (FITS; UNKNOWN: at the recorded OOM)
    stage: str  # "init", "pre-KV", "KV sizing" (ONE_REQUEST, ADDRESS_RANGE), "post-KV", "recorded OOM", "beyond the recording", ""
    non_torch_bytes: int | None = None  # the non-PyTorch memory assumed (see non_torch_source)
    non_torch_source: str = NT_NONE
    non_kv_source: str = ""  # reconcile.non_kv's source
    recorded_oom: Oom | None = None  # the OOM the recording ended in, when it did
    recorded_capacity_bytes: int | None = None  # the card the recording stood for
    #: the assumed non-PyTorch memory split by CUPTI's records (``non_torch.breakdown`` at the moment it
    #: was taken): what CUPTI saw, what was present when recording began, what grew unseen; None
    #: without CUPTI records or with ``--non-torch``
    non_torch_cupti_bytes: int | None = None
    non_torch_at_start_bytes: int | None = None
    non_torch_grew_unseen_bytes: int | None = None
    non_torch_cupti_own_bytes: int | None = None  # of the unexplained rest: CUPTI's own device memory
    #: how vLLM sizes the KV cache on this card: "profiling" (``util x capacity - non_kv``) or "extensible"
    #: (vLLM 0.34's default: measured after warm-up, :func:`fit_extensible`)
    kv_sizing: str = F.KV_SIZED_BY_PROFILING
    kv_blocks: int | None = None  # extensible: the blocks vLLM would commit, and their tokens
    kv_tokens: int | None = None
    #: memory other processes held on the recorded card, not put on this one (the card holds this process alone)
    others_left_out_bytes: int = 0
    #: where the answer goes past the recording (``analysis.boot``): where the recording ends and the model that
    #: carries it on ("" when the recording covers the answer), and where this card's figures come from
    prediction: str = ""
    prediction_how: str = ""
    missing: str = ""  # UNKNOWN: exactly what the trace lacks for an answer ("" when said by the recorded OOM)
    #: vLLM's "available KV cache memory" on this card, of which ``kv_cache_bytes`` is the whole blocks (None where
    #: vLLM never sizes it: it refuses or dies first)
    kv_available_bytes: int | None = None
    #: how much larger a card must be to boot (``analysis.boot``: the smallest card less this one, to the search's
    #: step; 0 when it boots here; None where no card up to the search's ceiling is known to boot)
    short_bytes: int | None = None

    @property
    def survives(self) -> bool:
        return self.outcome == FITS


def _first_crossing(curve: Curve, start_us: int, end_us: int, limit: int, shift: int = 0) -> int | None:
    """First time in [start_us, end_us] where curve + shift > limit; None when it never does."""
    if len(curve) == 0:
        return None
    if curve.at(start_us) + shift > limit:
        return start_us
    lo = int(np.searchsorted(curve.time_us, start_us, side="right"))
    hi = int(np.searchsorted(curve.time_us, end_us, side="right"))
    over = np.flatnonzero(curve.bytes[lo:hi] + shift > limit)
    return int(curve.time_us[lo + over[0]]) if len(over) else None


def _recorded_kv(lm: Landmarks) -> int | None:
    """The KV bytes the recorded run sized for (vLLM's figure), else the bytes it allocated."""
    return lm.vllm_available_kv_bytes if lm.vllm_available_kv_bytes is not None else lm.kv_cache_bytes


@dataclass(frozen=True)
class Recorded:
    """What every capacity's prediction shares: the analysed rank (its curves, landmarks, OOM, span and recorded
    card), what the start-up needs, the non-KV figure and the non-PyTorch memory assumed."""

    rank: Any  # analysed.rank.AnalysedRank
    need: Curve
    non_kv_bytes: int
    non_kv_source: str
    non_torch_bytes: int | None
    non_torch_source: str
    #: ``Fit``'s ``non_torch_*`` split fields by name (empty: nothing to split)
    non_torch_split: dict[str, int | None] = dataclasses.field(default_factory=dict)
    others_bytes: int = 0  # the most other processes held on the recorded card (``whatif.recorded_others``)
    one_request: int | None = None  # the KV bytes one max-model-len request needs (``whatif.recorded_one_request``)
    extensible: Prepared | None = None  # vLLM 0.34 sized the KV cache after warm-up (:func:`prepare`)


def recorded(rank, non_torch_bytes: int | None = None) -> Recorded:
    """Compute once what :func:`fit` needs for any capacity from what the analysed ``rank`` holds (its curves,
    landmarks, non-KV model, OOM and recorded target); ``non_torch_bytes``: ``--non-torch``."""
    trace, curves, lm, nk, oom, span = rank.trace, rank.curves, rank.landmarks, rank.non_kv, rank.oom, rank.span
    nt_at = None
    if non_torch_bytes is not None:
        nt, nt_source = int(non_torch_bytes), NT_ARGUMENT
    elif not lm.device_level:
        nt, nt_source = None, NT_NONE
    elif lm.before_kv_non_torch_bytes is not None:
        nt, nt_source, nt_at = lm.before_kv_non_torch_bytes, NT_AT_SIZING, lm.sizing_end_us
    else:  # no KV sizing recorded (died before it): the last steady figure the recording holds
        nt_at = oom.time_us if oom is not None else span[1]
        nt, nt_source = steady_non_torch_at(curves, nt_at), NT_LAST_STEADY
    split: dict[str, int | None] = {}
    b = non_torch.breakdown(trace, nt_at, "assumed", curves=curves) if nt_at is not None else None
    if b is not None and b.nvml_non_torch_bytes == nt:  # the same figure, split by CUPTI's records
        split = {
            f"non_torch_{k}_bytes": getattr(b, f"{k}_bytes") for k in ("cupti", "at_start", "grew_unseen", "cupti_own")
        }
    need = W.need_curve(trace, curves, lm, non_torch_bytes, rank.lifetimes)
    rec = Recorded(rank, need, nk.bytes if nk is not None else 0, nk.source if nk is not None else "", nt, nt_source,
                   split, W.recorded_others(trace), W.recorded_one_request(trace, _recorded_kv(lm)))  # fmt: skip
    return dataclasses.replace(rec, extensible=prepare(rank, rec))


def failed_request_peak(rank, need: Curve) -> tuple[int, int] | None:
    """The need at a recorded CUDA OOM with the failed request counted (it was asked for: the start-up needs it to get
    past there, as the what-if counts it), and when; None without an OOM."""
    oom = rank.oom
    return (need.at(oom.time_us) + oom.requested_bytes, oom.time_us) if oom is not None else None


def fit(trace: Trace, capacity_bytes: int, util: float | None = None, *, rec: Recorded) -> Fit:
    """Predict whether the start-up recorded in ``trace`` survives on a card of ``capacity_bytes``.

    Args:
        trace: a recorded start-up (any card size; a larger card shows more of the curve).
        capacity_bytes: physical memory of the card asked about.
        util: --gpu-memory-utilization on that card; default: the recorded one (``whatif.recorded_util``).
        rec: :func:`recorded` for this trace (and ``--non-torch``), shared between capacities.
    """
    if rec.extensible is not None:
        return fit_extensible(trace, capacity_bytes, util, rec)
    lm, need, oom = rec.rank.landmarks, rec.need, rec.rank.oom
    if util is None:
        util = W.recorded_util(trace)
    first_us, last_us = rec.rank.span
    end_us = min(oom.time_us, last_us) if oom is not None else last_us  # nothing is known after an OOM
    target = math.ceil(capacity_bytes * util)
    kv_new = profiled_kv_bytes(util, capacity_bytes, rec.non_kv_bytes)
    if rec.non_kv_source == KV_GIVEN and _recorded_kv(lm) is not None:
        kv_new = _recorded_kv(lm)  # --kv-cache-memory-bytes: the same KV cache on any card
    pre_end = lm.kv_start_us if lm.kv_start_us is not None else (lm.sizing_end_us or last_us)
    pre_end = min(pre_end, end_us)
    pre_peak, pre_t = window_peak(need, first_us, pre_end)
    failed = failed_request_peak(rec.rank, need)
    if failed is not None and failed[1] <= pre_end and failed[0] > pre_peak:
        pre_peak, pre_t = failed

    per, tpb = W.kv_block(trace.facts)

    def result(outcome, phase, overshoot, stage, post=None, post_phase="", headroom=0, available=None):
        kv = 0 if outcome in (NO_KV, REFUSED) or stage == "pre-KV" else kv_new  # never sized: no KV cache
        blocks = kv // per if kv > 0 and per else None  # vLLM allocates whole blocks of what is available
        return Fit(capacity_bytes, util, target, rec.non_kv_bytes, blocks * per if blocks is not None else kv, pre_peak,
                   path_at(trace, pre_t), post, post_phase, outcome, phase, overshoot, headroom, stage,
                   rec.non_torch_bytes, rec.non_torch_source, rec.non_kv_source, oom,
                   rec.rank.recorded_target.capacity_bytes, **rec.non_torch_split, kv_blocks=blocks,
                   kv_tokens=blocks * tpb if blocks is not None and tpb else None, kv_available_bytes=kv or available,
                   others_left_out_bytes=rec.others_bytes)  # fmt: skip

    # vLLM's request_memory check in init_device (not with 0.34's extensible KV cache: util 1.0 of the card is never
    # free at start-up, and the H200's start-ups passed it beside a 127 GiB neighbour)
    init_end = W.init_device_end(trace)
    if init_end is not None and init_end <= end_us and F.is_vllm(trace.facts) and not W.extensible_kv_cache(trace):
        # vLLM compares its own snapshot's free memory (the CUDA context then); the need curve at init_device's end
        # holds the non-PyTorch memory assumed for the whole start-up (NVML at KV sizing: cuBLAS, NCCL... larger)
        free_at_init = capacity_bytes - W.init_used(trace, need.at)
        if free_at_init < target:
            return result(REFUSED, PN.INIT_DEVICE, target - free_at_init, "init")
    # 3. pre-KV: the card-independent part must fit physically
    t = _first_crossing(need, first_us, pre_end, capacity_bytes)
    if t is not None:
        return result(OOM, path_at(trace, t), pre_peak - capacity_bytes, "pre-KV")  # "": outside any phase
    kv_rec, one_request = _recorded_kv(lm), rec.one_request
    if oom is not None and (lm.kv_end_us is None or oom.time_us < lm.kv_end_us):  # died before the KV cache
        at = _at_oom(rec, capacity_bytes, target, 0, result)
        if at.outcome == UNKNOWN and kv_new <= 0 and rec.non_kv_source == MEMTRACE:  # refused whatever came next
            return result(NO_KV, PN.KV_SIZING_CHECK, W.kv_short(one_request, kv_new), "KV sizing", available=kv_new)
        return at
    if lm.sizing_end_us is None and not F.is_vllm(trace.facts):  # a program with no KV cache: all of it fits
        return result(FITS, "", 0, NO_KV_CACHE, headroom=capacity_bytes - pre_peak)
    # 4. KV sizing
    if kv_new <= 0:
        return result(NO_KV, PN.KV_SIZING_CHECK, W.kv_short(one_request, kv_new), "KV sizing", available=kv_new)
    if one_request is not None and kv_new < one_request:  # vLLM: "To serve at least one request..."
        return result(NO_KV, PN.KV_SIZING_CHECK, W.kv_short(one_request, kv_new), ONE_REQUEST, available=kv_new)
    if lm.kv_end_us is None or kv_rec is None:  # the recording ends before the KV cache was allocated
        if lm.sizing_end_us is None:
            return result(UNKNOWN, "", 0, "beyond the recording", headroom=capacity_bytes - pre_peak)
        return result(FITS, "", 0, "", headroom=capacity_bytes - pre_peak)
    return _post_kv(trace, rec, capacity_bytes, target, kv_new - kv_rec, end_us, pre_peak, result)


def _post_kv(trace: Trace, rec: Recorded, capacity: int, target: int, shift: int, end_us: int, pre_peak: int, result):
    """Step 5: the recorded curve after the KV cache, moved by ``shift`` (the change in KV bytes)."""
    lm, need = rec.rank.landmarks, rec.need
    post_raw, post_t = window_peak(need, lm.kv_end_us, end_us)
    post_bytes, post_phase = post_raw + shift, path_at(trace, post_t)
    t = _first_crossing(need, lm.kv_start_us or lm.kv_end_us, end_us, capacity, shift)
    if t is not None:
        over = post_bytes - capacity
        return result(OOM, path_at(trace, t) or "after the KV cache", over, "post-KV", post_bytes, post_phase)
    if rec.rank.oom is not None:
        return _at_oom(rec, capacity, target, shift, result, post_bytes, post_phase)
    return result(FITS, "", 0, "", post_bytes, post_phase, capacity - max(pre_peak, post_bytes))


def _at_oom(rec: Recorded, capacity: int, target: int, shift: int, result, post=None, post_phase="") -> Fit:
    """DIED or UNKNOWN at the recorded OOM (see the module docstring)."""
    oom, lm, card, curves = rec.rank.oom, rec.rank.landmarks, rec.rank.recorded_target, rec.rank.curves
    needed = rec.need.at(oom.time_us) + shift + oom.requested_bytes
    # the room the recording had: its card less what other processes held then (the asked card holds this
    # process alone)
    others = curves.others.at(oom.time_us) if len(curves.others) else 0
    if shift == 0 and (lm.kv_end_us is None or oom.time_us < lm.kv_end_us):
        no_roomier = card.capacity_bytes is not None and capacity <= card.capacity_bytes - others
    else:
        no_roomier = (
            card.capacity_bytes is not None
            and card.target_bytes is not None
            and capacity - target <= card.capacity_bytes - others - card.target_bytes
        )
    if needed > capacity or no_roomier:
        return result(DIED, oom.phase_path, max(needed - capacity, 0), "recorded OOM", post, post_phase)
    return result(UNKNOWN, oom.phase_path, 0, "beyond the recording", post, post_phase, capacity - needed)


# ---------------------------------------------------------------------------------------------------------
# vLLM 0.34's extensible KV cache (see the module docstring)


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
    non_kv_bytes: int | None


def prepare(rank, rec: Recorded) -> Prepared | None:
    """The card-independent part of :func:`fit_extensible` from what the analysed ``rank`` and ``rec`` already hold:
    the sizing, what the start-up needs, the non-KV figure; None for a trace whose KV cache was not sized after
    warm-up."""
    trace, sizing = rank.trace, rank.extensible
    if trace.facts.get(F.VLLM_KV_SIZE_SOURCE) != F.KV_SIZED_EXTENSIBLE or sizing is None:
        return None
    total = sizing.term("free").vllm_bytes and (
        (trace.facts.get(F.VLLM_KV_SIZING) or {}).get("total_memory_bytes") or trace.process.device_total_bytes
    )
    if not total:
        return None
    extend = next((p for p in trace.phases if p.name == PN.KV_CACHE_EXTEND), None)
    end = extend.start_us if extend is not None else sizing.time_us
    held_from, floor = null_blocks(trace) or (end, 0)
    window = rec.need.window(rec.need.time_us[0] if len(rec.need) else 0, end)
    need_b = window.bytes + (window.time_us >= held_from) * floor
    i = max(first_max(need_b), 0)
    peak, peak_t = (int(need_b[i]), int(window.time_us[i])) if len(need_b) else (0, end)
    return Prepared(sizing, int(total), window.time_us, need_b.astype(np.int64), peak, path_at(trace, peak_t),
                    extend is not None, rec.non_kv_bytes if rec.non_kv_source else None)  # fmt: skip


def fit_extensible(trace: Trace, capacity_bytes: int, util: float | None, rec: Recorded, others_bytes: int = 0) -> Fit:
    """The prediction on a card of ``capacity_bytes`` (CUDA's total) of which other processes hold ``others_bytes``,
    for a start-up whose KV cache vLLM sized after warm-up (``rec.extensible``)."""
    prep, facts = rec.extensible, trace.facts
    util = W.recorded_util(trace) if util is None else util
    requested, pre = math.ceil(capacity_bytes * util), prep.peak_bytes + others_bytes

    def result(outcome, phase="", over=0, stage="KV sizing", blocks=None, kv=0, available=None):
        tpb = F.kv_tokens_per_block(facts)
        return Fit(capacity_bytes, util, requested, rec.non_kv_bytes, kv, pre, prep.peak_phase, None, "", outcome,
                   phase, max(over, 0), capacity_bytes - pre if outcome == FITS else 0, stage, rec.non_torch_bytes,
                   rec.non_torch_source, rec.non_kv_source, None, rec.rank.recorded_target.capacity_bytes, **rec.non_torch_split,
                   kv_sizing=F.KV_SIZED_EXTENSIBLE, kv_blocks=blocks, kv_tokens=blocks * tpb if blocks and tpb else None,
                   kv_available_bytes=available, others_left_out_bytes=rec.others_bytes)  # fmt: skip

    # 1. before the KV cache is extended
    over = np.flatnonzero(prep.need + others_bytes > capacity_bytes)
    if len(over):
        return result(OOM, path_at(trace, int(prep.time_us[over[0]])), pre - capacity_bytes, "pre-KV")
    # 2. the address range
    one, bpb, s = rec.one_request, prep.sizing.bytes_per_block, facts.get(F.VLLM_KV_SIZING) or {}
    rng, most = (None, int(s.get("capacity_blocks") or 0)) if prep.non_kv_bytes is None else address_range(
        util, capacity_bytes, prep.non_kv_bytes, bpb)  # fmt: skip
    if rng is not None and (rng <= 0 or (one is not None and rng < one)):
        return result(NO_KV, PN.KV_SIZING_CHECK, W.kv_short(one, rng), ADDRESS_RANGE, available=rng)
    # 3. the size, by vLLM's formula on this card: the bytes this card has less of, free (the recorded card's other
    # processes are not on it, unless given back as ``others_bytes``)
    lacks = prep.recorded_total - rec.others_bytes - capacity_bytes + others_bytes
    strides, granule = [int(x) for x in s.get("segment_strides") or []], int(s.get("granularity_bytes") or 0)
    available, blocks, kv = sized(extensible_inputs(s, lacks), requested, strides, granule, most)
    if blocks <= 1 or (one is not None and (blocks - 1) * bpb < one):  # the null block holds no request
        return result(NO_KV, path_at(trace, prep.sizing.time_us), W.kv_short(one, available), available=available)
    return result(FITS if prep.extended else UNKNOWN, stage="", blocks=blocks, kv=kv, available=available)
