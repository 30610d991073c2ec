"""The landmarks of vLLM's KV-cache sizing in one trace, shared by ``diff`` and ``fits``.

vLLM sizes its KV cache from what is in use when profiling ends: ``available_kv = util × total −
non_kv``. The figures a regression gate and a capacity what-if need are therefore:

- **memory before KV sizing**: PyTorch reserved + non-PyTorch memory (CUDA context, NCCL, raw
  cudaMalloc) at the end of ``determine_available_memory`` (or, without it, at the start of the KV
  cache allocation);
- **pre-KV peak**: the highest device-level memory before the KV cache is allocated (weights,
  workspaces, profile_run's activations, non-PyTorch memory);
- **KV cache**: the bytes allocated inside the KV-allocation phase (``initialize_kv_cache``);
- **post-KV transient**: the highest device-level memory after the KV cache exists, minus the
  memory in use right after it was allocated (warm-up, CUDA-graph capture).

"Device level" is the *total* curve: the exact reserved curve plus the non-PyTorch memory of the
last steady NVML sample at or before each moment (see :func:`steady_non_torch`; the first one's
value before it). A trace without NVML samples falls back to reserved alone
(``Landmarks.device_level`` is False).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.analysis.memory.curves import Curve, Curves, committed_curve
from memtrace.analysis.memory.phases import path_at, recording_span
from memtrace.analysis.memory.quantities import window_peak
from memtrace.model import Phase, Trace

#: Phase names marking vLLM's KV sizing (the profiling step that ends with the KV figure).
SIZING_NAMES = (PN.DETERMINE_AVAILABLE_MEMORY,)
#: Phase names marking the KV cache allocation, preferred first.
KV_INIT_NAMES = ("initialize_kv_cache", PN.KV_CACHE_INIT, "allocate_kv_cache", "initialize_from_config")


#: NVML samples within this many microseconds of a change of the reserved curve are not used to
#: measure non-PyTorch memory: the sidecar's clock and the allocator's differ by about a millisecond,
#: so while memory moves fast (8 x 15 GiB of KV cache in 9 ms on an H200) used - reserved is off by
#: whole allocations (16 GiB "non-PyTorch" spikes measured in tests/data/h200/startup-full).
STEADY_GUARD_US = 5_000


def steady_non_torch(curves: Curves, guard_us: int = STEADY_GUARD_US) -> Curve:
    """Non-PyTorch memory measured only at NVML samples where reserved held still for ±guard_us.

    Each kept sample's value holds until the next kept one; the first kept value also holds before
    it. Returns the raw non-PyTorch curve when no sample is steady, an empty curve without samples.
    """
    nt, res = curves.non_torch, curves.reserved
    if len(nt) == 0 or len(res) == 0:
        return nt
    before = np.searchsorted(res.time_us, nt.time_us - guard_us, side="right")
    after = np.searchsorted(res.time_us, nt.time_us + guard_us, side="right")
    lo, hi = np.clip(before - 1, 0, None), np.clip(after - 1, 0, None)
    steps = np.concatenate(([0], np.cumsum(res.bytes[1:] != res.bytes[:-1])))  # changes up to index i
    keep = steps[hi] == steps[lo]
    if not keep.any():
        return nt
    return Curve(nt.time_us[keep], nt.bytes[keep])


def steady_non_torch_at(curves: Curves, t_us: int) -> int | None:
    """Non-PyTorch bytes at ``t_us``: the last steady NVML sample at or before it (the first one's
    value before it); None without samples. THE figure of non-PyTorch memory at a moment."""
    if not curves.has_device:
        return None
    steady = steady_non_torch(curves)
    return int(steady.at(max(t_us, int(steady.time_us[0])))) if len(steady) else None


def steady_non_torch_values(curves: Curves, times_us: np.ndarray) -> np.ndarray:
    """:func:`steady_non_torch_at` at each of ``times_us`` (int64; zeros without samples)."""
    if not curves.has_device:
        return np.zeros(len(times_us), dtype=np.int64)
    return steady_non_torch(curves).at_each(times_us, first_before=True)


def total_curve(curves: Curves, *, include_non_torch: bool = True, base: Curve | None = None) -> Curve:
    """``base`` (default: reserved + what CUDA's VMM API committed, ``Curves.held``) + steady non-PyTorch
    memory at every event and kept sample.

    Without NVML samples (or with ``include_non_torch=False``) it is ``base`` alone.
    """
    res = base if base is not None else curves.held  # reserved + VMM committed (vLLM 0.34+)
    nt = steady_non_torch(curves) if include_non_torch else None
    if nt is None or len(nt) == 0:
        return res
    times = np.union1d(res.time_us, nt.time_us).astype(np.int64)
    ri = np.searchsorted(res.time_us, times, side="right") - 1
    r = np.where(ri >= 0, res.bytes[np.clip(ri, 0, None)], 0) if len(res) else np.zeros(len(times), np.int64)
    ni = np.clip(np.searchsorted(nt.time_us, times, side="right") - 1, 0, None)
    return Curve(times, (r + nt.bytes[ni]).astype(np.int64))


@dataclass(frozen=True)
class Moment:
    """A value of the total curve at a time, with the phase path in force then."""

    time_us: int
    bytes: int
    phase: str


@dataclass(frozen=True)
class Landmarks:
    """KV-sizing landmarks of one trace; a field is None when the trace lacks the phase it needs."""

    device_level: bool  # True when non-PyTorch memory (NVML) is included
    sizing_end_us: int | None  # when vLLM measured what is left for the KV cache
    before_kv_bytes: int | None  # reserved + non-torch at that moment
    before_kv_non_torch_bytes: int | None
    pre_kv_peak: Moment | None  # highest total memory before the KV cache was allocated
    kv_start_us: int | None
    kv_end_us: int | None
    kv_cache_bytes: int | None  # allocated inside the KV-allocation phase
    after_kv_bytes: int | None  # total memory right after the KV cache was allocated
    post_kv_peak: Moment | None  # highest total memory after it
    vllm_available_kv_bytes: int | None  # vLLM's own figure (facts), when recorded
    target_bytes: int | None
    gpu_memory_utilization: float | None
    peak: Moment  # the highest total memory of the whole trace

    @property
    def post_kv_transient_bytes(self) -> int | None:
        peak, after = self.post_kv_peak, self.after_kv_bytes
        return None if peak is None or after is None else max(0, peak.bytes - after)

    @property
    def non_kv_bytes(self) -> int | None:
        """vLLM's own non-KV figure: target − available KV (facts), when both were recorded. A part of
        the authoritative model, ``analysis.reconcile.non_kv``: use that."""
        available, target = self.vllm_available_kv_bytes, self.target_bytes
        return None if available is None or target is None else target - available


def _first_phase(trace: Trace, names: tuple[str, ...], after_us: int | None = None) -> Phase | None:
    """The first phase (by start) named like ``names`` (earlier names preferred)."""
    for name in names:
        found = [p for p in trace.phases if p.name == name and (after_us is None or p.start_us >= after_us)]
        if found:
            return min(found, key=lambda p: p.start_us)  # the first of equal starts
    return None


def _moment(trace: Trace, curve: Curve, start_us: int, end_us: int) -> Moment | None:
    if len(curve) == 0 or end_us < start_us:
        return None
    value, t = window_peak(curve, start_us, end_us)
    return Moment(t, value, path_at(trace, t))


def landmarks(trace: Trace, curves: Curves, *, include_non_torch: bool = True) -> Landmarks:
    """Find the KV-sizing landmarks of ``trace``.

    Args:
        trace: the trace.
        curves: the run's curves (``AnalysedRank.curves``): no figure is made from curves of its own.
        include_non_torch: add NVML's non-PyTorch memory to reserved (when the trace has samples).
    """
    include_non_torch = include_non_torch and len(curves.non_torch) > 0
    total = total_curve(curves, include_non_torch=include_non_torch)
    first_us, last_us = recording_span(trace)
    peak = _moment(trace, total, first_us, last_us) or Moment(first_us, 0, "")

    sizing = _first_phase(trace, SIZING_NAMES)
    sizing_end = sizing.end_us if sizing is not None else None
    kv = _first_phase(trace, KV_INIT_NAMES, after_us=sizing_end)
    kv_start, kv_end = (kv.start_us, kv.end_us) if kv is not None else (None, None)
    sizing_end = kv_start if sizing_end is None else sizing_end

    before = total.at(sizing_end) if sizing_end is not None else None
    before_nt = before - curves.reserved.at(sizing_end) if before is not None else None
    pre_end = kv_start if kv_start is not None else sizing_end
    pre_peak = _moment(trace, total, first_us, pre_end) if pre_end is not None else None

    kv_bytes = after = post_peak = None
    if kv_start is not None and kv_end is not None:
        kv_bytes = max(0, curves.allocated.at(kv_end) - curves.allocated.at(kv_start))
        after = total.at(kv_end)
        post_peak = _moment(trace, total, kv_end, last_us)
    if len(curves.vmm):  # vLLM 0.34's extensible KV cache: its pages, committed by the end of kv_cache_extend,
        # and what comes after the KV cache is whole counts from there
        extend = next((p for p in trace.phases if p.name == PN.KV_CACHE_EXTEND and p.end_us), None)
        until = extend.end_us if extend is not None else (kv_end or last_us)
        kv_bytes = (kv_bytes or 0) + committed_curve(trace, kv_cache_only=True).at(until)
        if extend is not None:
            after = total.at(until)
            post_peak = _moment(trace, total, until, last_us)

    util = trace.facts.get(F.UTIL)
    return Landmarks(
        device_level=include_non_torch,
        sizing_end_us=sizing_end,
        before_kv_bytes=before,
        before_kv_non_torch_bytes=before_nt,
        pre_kv_peak=pre_peak,
        kv_start_us=kv_start,
        kv_end_us=kv_end,
        kv_cache_bytes=kv_bytes,
        after_kv_bytes=after,
        post_kv_peak=post_peak,
        vllm_available_kv_bytes=F.int_fact(trace.facts, F.VLLM_AVAILABLE_KV_BYTES),
        target_bytes=F.int_fact(trace.facts, F.TARGET_BYTES),
        gpu_memory_utilization=float(util) if isinstance(util, (int, float)) else None,
        peak=peak,
    )
