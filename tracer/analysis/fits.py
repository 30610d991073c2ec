"""The capacity what-if: would this start-up survive on a card of another size, and where would it die?

Model (vLLM's own sizing, applied to a recorded start-up):

1. What does not depend on the card stays as recorded: weights, workspaces, the activations of
   ``profile_run`` (sized by ``max_num_batched_tokens``), CUDA context and other non-PyTorch memory.
   So the whole curve *before* the KV cache is allocated is the same on any card.
2. vLLM sizes the KV cache as ``ceil(util × capacity) − non_kv`` where ``non_kv`` is its measure of
   everything that is not KV cache (recorded as ``target − available KV`` when the trace holds
   vLLM's figures; else the pre-KV peak of reserved + non-PyTorch memory).
3. The run dies (OOM) in the first phase where the pre-KV curve goes over the *physical* capacity:
   ``util`` cannot help there, it only bounds what is allocated after profiling. The curve compared
   is what the start-up *needs*: the pinned segments (``analysis.pinned``: the caching allocator
   releases free cached segments before it fails) plus non-PyTorch memory, as recorded or as given
   (``non_torch_bytes``: a different card has a different CUDA context).
4. ``KV ≤ 0``: vLLM refuses to start ("No available memory for the cache blocks"); so it does
   when the KV cache cannot hold one request of ``max_model_len`` tokens (bytes per token as
   recorded).
   Before all that, vLLM itself (not a plain PyTorch program) refuses at ``init_device`` when the
   free memory then (capacity − memory in use at the end of init_device) is below util × capacity.
5. After the KV cache exists, the recorded curve moves by the change in KV bytes
   (``shift = KV(capacity) − KV(recorded)``); the run dies in the first phase (warm-up, CUDA-graph
   capture) where the shifted curve goes over the physical capacity.

Pure functions over a Trace; figures are bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..model import FACT_OOM, FACT_VLLM_KV_TOKENS, Trace
from .curves import Curve, Curves, all_curves
from .landmarks import Landmarks, landmarks, total_curve
from .phases import path_at, recording_span, window_peak
from .pinned import pinned_curve

#: vLLM's default --gpu-memory-utilization, used when the trace did not record one.
DEFAULT_UTIL = 0.9

FITS = "fits"
OOM = "oom"
NO_KV = "no-kv-memory"
UNKNOWN = "unknown"  # the recording ends (the run died) before the part that decides
REFUSED = "refused-at-init"  # vLLM: free memory at init_device is less than util × capacity


@dataclass(frozen=True)
class Fit:
    """The prediction for one capacity."""

    capacity_bytes: int
    util: float
    target_bytes: int  # ceil(util × capacity): what vLLM may fill
    non_kv_bytes: int  # what vLLM counts as not KV cache (card-independent)
    kv_cache_bytes: int  # what vLLM would allocate for the KV cache (≤ 0: it refuses)
    pre_kv_peak_bytes: int
    pre_kv_peak_phase: str
    post_kv_peak_bytes: int | None  # None when the run would not get that far or the trace lacks it
    post_kv_peak_phase: str
    outcome: str  # FITS, OOM, NO_KV, REFUSED or UNKNOWN
    phase: str  # where it dies ("" when it fits)
    overshoot_bytes: int  # by how much it goes over the capacity (OOM), or the missing KV bytes (NO_KV)
    headroom_bytes: int  # the smallest gap under the capacity (FITS)
    stage: str  # "pre-KV" (profiling), "KV sizing", "post-KV" (warm-up / capture), "" when it fits

    @property
    def survives(self) -> bool:
        return self.outcome == FITS


def _first_crossing(trace: Trace, curve: Curve, start_us: int, end_us: int, limit: int, shift: int = 0) -> int | None:
    """First time in [start_us, end_us] where curve + shift > limit; None when it never does."""
    if len(curve) == 0:
        return None
    if curve.at(start_us) + shift > limit:
        return start_us
    lo = int(np.searchsorted(curve.time_us, start_us, side="right"))
    hi = int(np.searchsorted(curve.time_us, end_us, side="right"))
    over = np.flatnonzero(curve.bytes[lo:hi] + shift > limit)
    return int(curve.time_us[lo + over[0]]) if len(over) else None


def _non_kv(lm: Landmarks) -> int:
    if lm.non_kv_bytes is not None:
        return lm.non_kv_bytes
    if lm.pre_kv_peak is not None:
        return lm.pre_kv_peak.bytes
    return lm.peak.bytes


def _recorded_kv(lm: Landmarks) -> int | None:
    """The KV bytes the recorded run sized for (vLLM's figure), else the bytes it allocated."""
    if lm.vllm_available_kv_bytes is not None:
        return lm.vllm_available_kv_bytes
    return lm.kv_cache_bytes


def need_curve(trace: Trace, curves: Curves, lm: Landmarks, non_torch_bytes: int | None = None) -> Curve:
    """What the start-up needs on the card at each moment: the pinned segments (``pinned``: what the
    allocator cannot release) plus non-PyTorch memory, as recorded (steady NVML samples) or, when
    ``non_torch_bytes`` is given, that constant (another card's CUDA context, say)."""
    base = pinned_curve(trace, curves)
    if non_torch_bytes is not None:
        return Curve(base.time_us, base.bytes + int(non_torch_bytes))
    return total_curve(curves, include_non_torch=lm.device_level, base=base)


def fit(
    trace: Trace,
    capacity_bytes: int,
    util: float | None = None,
    *,
    non_torch_bytes: int | None = None,
    curves: Curves | None = None,
    lm: Landmarks | None = None,
    need: Curve | None = None,
) -> Fit:
    """Predict whether the start-up recorded in ``trace`` survives on a card of ``capacity_bytes``.

    Args:
        trace: a recorded start-up (any card size; a larger card shows more of the curve).
        capacity_bytes: physical memory of the card asked about.
        util: --gpu-memory-utilization on that card; default: the recorded one, else 0.9.
        non_torch_bytes: non-PyTorch memory on that card (CUDA context, NCCL, libraries), held
            constant; default: as recorded (NVML).
        curves, lm, need: precomputed curves, landmarks and :func:`need_curve`, to share work.
    """
    curves = curves or all_curves(trace)
    lm = lm or landmarks(trace, curves)
    need = need if need is not None else need_curve(trace, curves, lm, non_torch_bytes)
    if util is None:
        util = lm.gpu_memory_utilization or DEFAULT_UTIL
    first_us, last_us = recording_span(trace)
    target = math.ceil(capacity_bytes * util)
    non_kv = _non_kv(lm)
    kv_new = target - non_kv
    pre_end = lm.kv_start_us if lm.kv_start_us is not None else (lm.sizing_end_us or last_us)
    pre_peak, pre_t = window_peak(need, first_us, pre_end)
    pre_phase = path_at(trace, pre_t)

    def result(outcome, phase, overshoot, stage, post=None, post_phase="", headroom=0):
        return Fit(capacity_bytes, util, target, non_kv, kv_new, pre_peak, pre_phase, post, post_phase,
                   outcome, phase, overshoot, headroom, stage)  # fmt: skip

    # vLLM's request_memory check in init_device
    init_end = _init_device_end(trace)
    if init_end is not None and _is_vllm(trace):
        free_at_init = capacity_bytes - need.at(init_end)
        if free_at_init < target:
            return result(REFUSED, "init_device", target - free_at_init, "init")
    # 3. pre-KV: the card-independent part must fit physically
    t = _first_crossing(trace, need, first_us, pre_end, capacity_bytes)
    if t is not None:
        return result(OOM, path_at(trace, t) or "before the first phase", pre_peak - capacity_bytes, "pre-KV")
    # 4. KV sizing
    if kv_new <= 0:
        return result(NO_KV, "KV sizing (after determine_available_memory)", -kv_new, "KV sizing")
    kv_rec = _recorded_kv(lm)
    one_request = _one_request_bytes(trace, kv_rec)
    if one_request is not None and kv_new < one_request:  # vLLM: "To serve at least one request..."
        return result(NO_KV, "KV sizing (one max_model_len request does not fit)", one_request - kv_new, "KV sizing")
    if lm.kv_end_us is None or kv_rec is None:  # the recording ends before the KV cache was allocated
        if trace.facts.get(FACT_OOM) or lm.sizing_end_us is None:
            return result(UNKNOWN, "", 0, "beyond the recording", headroom=capacity_bytes - pre_peak)
        return result(FITS, "", 0, "", headroom=capacity_bytes - pre_peak)
    # 5. post-KV: the recorded curve moved by the change in KV bytes
    shift = kv_new - kv_rec
    post_raw, post_t = window_peak(need, lm.kv_end_us, last_us)
    post_bytes, post_phase = post_raw + shift, path_at(trace, post_t)
    t = _first_crossing(trace, need, lm.kv_start_us or lm.kv_end_us, last_us, capacity_bytes, shift)
    if t is not None:
        over = post_bytes - capacity_bytes
        return result(OOM, path_at(trace, t) or "after the KV cache", over, "post-KV", post_bytes, post_phase)
    highest = max(pre_peak, post_bytes)
    return result(FITS, "", 0, "", post_bytes, post_phase, capacity_bytes - highest)


def _one_request_bytes(trace: Trace, kv_rec: int | None) -> int | None:
    """KV bytes one request of max_model_len tokens needs (vLLM refuses to start below it), from the
    recorded KV bytes per token; None when the trace lacks the figures (not a vLLM trace)."""
    tokens = trace.facts.get(FACT_VLLM_KV_TOKENS)
    max_len = (trace.facts.get("vllm.config") or {}).get("max_model_len")
    if not kv_rec or not isinstance(tokens, int) or tokens <= 0 or not isinstance(max_len, int):
        return None
    return math.ceil(kv_rec / tokens * max_len)


def _init_device_end(trace: Trace) -> int | None:
    ends = [p.end_us for p in trace.phases if p.name == "init_device" and p.end_us is not None]
    return min(ends) if ends else None


def _is_vllm(trace: Trace) -> bool:
    """Recorded by the vLLM plugin (a plain PyTorch program makes no request_memory check)."""
    return any(k in trace.facts for k in ("vllm.version", "vllm.config"))


def fits(
    trace: Trace, capacities: list[int], util: float | None = None, *, non_torch_bytes: int | None = None
) -> list[Fit]:
    """:func:`fit` for several capacities, sharing the curves."""
    curves = all_curves(trace)
    lm = landmarks(trace, curves)
    need = need_curve(trace, curves, lm, non_torch_bytes)
    return [fit(trace, c, util, curves=curves, lm=lm, need=need) for c in capacities]


def smallest_fitting(
    trace: Trace,
    util: float | None = None,
    *,
    non_torch_bytes: int | None = None,
    lo: int = 1 << 30,
    hi: int | None = None,
) -> int | None:
    """The smallest capacity (to 64 MiB) on which the start-up survives, or None above ``hi``."""
    curves = all_curves(trace)
    lm = landmarks(trace, curves)
    need = need_curve(trace, curves, lm, non_torch_bytes)
    hi = hi or max(lm.peak.bytes * 4, lo)
    if not fit(trace, hi, util, curves=curves, lm=lm, need=need).survives:
        return None
    step = 64 << 20
    while hi - lo > step:
        mid = (lo + hi) // 2
        if fit(trace, mid, util, curves=curves, lm=lm, need=need).survives:
            hi = mid
        else:
            lo = mid
    return hi
