"""vLLM's non-KV memory, the one model: memtrace's reconstruction of vLLM's KV-cache sizing (pure).

:func:`reconcile_kv` (vLLM's own formula on memtrace's curves) is THE figure of vLLM's non-KV memory; :func:`non_kv`
adds its fallbacks (vLLM's recorded target - available KV, then the pre-KV peak of a program that is not vLLM), and
``report`` and ``fits`` both show it ("what vLLM keeps out of the KV cache" = non-KV + the CUDA-graph estimate).
vLLM sizes ``available = ceil(total x util) - non_kv - graph_estimate`` with ``non_kv`` measured around
``profile_run``, by release (read from the worker attributes in ``facts["vllm.profile"]``, else ``vllm.version``):

- **vLLM 0.25.x** (the graph profile inside ``memory_profiling``): ``non_kv = non_torch_increase +
  torch_peak_increase + weights_memory``, from the init snapshot to the end of ``determine_available_memory``;
- **vLLM 0.32 and later** (the graph profile after it): ``non_kv = total_consumed + transient_peak_headroom``
  (device used from the init snapshot to the start of ``cudagraph_profile``; peak allocated in ``profile_run``
  less allocated then).

Device memory comes from NVML's samples (``"nvml"``, the default with samples) or the plugin's ``cudaMemGetInfo``
readings at phase edges (``"boundaries"``, the calls vLLM's MemorySnapshot makes). "init snapshot" is the end of
``init_device``; what appeared between vLLM's own snapshot and then, before memtrace's curves begin, is its own
term (``init_gap_bytes``): vLLM counts it. The graph estimate is vLLM's own (a recorded fact), not re-derived.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.analysis.memory.curves import Curve, Curves, all_curves
from memtrace.analysis.memory.quantities import window_max
from memtrace.model import Phase, Trace

FORMULA_025 = "vllm-0.25"
FORMULA_033 = "vllm-0.33"
#: what each formula is called on screen: the vLLM releases that use it (``choose_formula``'s rule), so a
#: 0.34 report does not read as if it came from 0.33
FORMULA_LABEL = {FORMULA_025: "the formula of vLLM up to 0.31", FORMULA_033: "the formula of vLLM 0.32 and later"}


@dataclass(frozen=True)
class KvReconciliation:
    """Every term of memtrace's reconstruction, in bytes, and vLLM's own figure beside it."""

    formula: str
    source: str  # "nvml" or "boundaries"
    target_bytes: int
    weights_bytes: int
    peak_allocated_bytes: int  # peak allocated during profile_run
    non_kv_bytes: int
    graph_estimate_bytes: int  # vLLM's estimate, as applied (0 when disabled)
    available_kv_bytes: int
    vllm_available_kv_bytes: int | None
    torch_peak_increase_bytes: int | None = None  # 0.25
    non_torch_increase_bytes: int | None = None  # 0.25
    total_consumed_bytes: int | None = None  # 0.33
    transient_peak_headroom_bytes: int | None = None  # 0.33
    init_us: int = 0
    after_us: int = 0
    #: device memory (non-torch for 0.25, used for 0.33) that appeared between vLLM's own init snapshot
    #: (inside init_device, before the model runner is built) and the end of init_device, where
    #: memtrace's curves start, from the plugin's cudaMemGetInfo reading there: vLLM counts it, so it
    #: is a term of ``non_kv_bytes`` (None, counted as 0, when the trace lacks either reading).
    init_gap_bytes: int | None = None
    first_sample_delay_us: int = 0  # NVML's first sample came this long after init_device ended
    graph_estimate_disabled_bytes: int | None = None  # recorded but not applied (env switch)
    notes: list[str] = field(default_factory=list)

    @property
    def withheld_bytes(self) -> int:
        """What vLLM keeps out of the KV cache: target - available KV = non-KV + CUDA-graph estimate."""
        return self.target_bytes - self.available_kv_bytes

    @property
    def difference_bytes(self) -> int | None:
        """memtrace's available KV minus vLLM's."""
        vllm = self.vllm_available_kv_bytes
        return None if vllm is None else self.available_kv_bytes - vllm


def _phase(trace: Trace, name: str) -> Phase | None:
    return next((p for p in trace.phases if p.name == name), None)


def choose_formula(facts: dict[str, Any]) -> str:
    """FORMULA_025 or FORMULA_033 for the vLLM that wrote these facts."""
    profile = facts.get(F.VLLM_PROFILE) or {}
    if "non_torch_memory_bytes" in profile:
        return FORMULA_025
    if "total_consumed_bytes" in profile:
        return FORMULA_033
    release = F.vllm_release(facts.get(F.VLLM_VERSION))
    if release is not None and release < (0, 32):
        return FORMULA_025
    return FORMULA_033


def _graph_estimate(trace: Trace) -> tuple[int, int | None, list[str]]:
    """(estimate applied, estimate recorded but switched off, notes)."""
    estimate = trace.facts.get(F.VLLM_GRAPH_ESTIMATE_BYTES)
    if not isinstance(estimate, int):
        return 0, None, ["no CUDA-graph estimate recorded (eager, or no cudagraph_profile phase): counted as none"]
    environ = (trace.facts.get(F.ENV) or {}).get("environ") or {}
    if str(environ.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1")).strip() == "0":
        return 0, estimate, ["CUDA-graph estimate not applied (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0)"]
    return estimate, None, []


def _sampled_at(curve: Curve, t_us: int) -> int | None:
    """The curve's value at ``t_us``, or None when it has no sample at or before it."""
    return None if len(curve) == 0 or int(curve.time_us[0]) > t_us else curve.at(t_us)


def phase_reading(trace: Trace, phase: str, edge: str) -> dict[str, int] | None:
    """The plugin's memory reading at ``phase``'s ``edge`` ("start" / "end"; ``facts.PHASE_MEMORY``), if taken."""
    return next(
        (r for r in trace.facts.get(F.PHASE_MEMORY) or [] if (r.get("phase"), r.get("edge")) == (phase, edge)), None
    )


def _device(trace: Trace, curves: Curves, source: str, init_us: int, after_us: int, after_key) -> tuple[list, list]:
    """(device used, non-torch bytes) at the two instants, from NVML curves or boundary readings (None: not taken)."""
    if source == "nvml":
        at = (init_us, after_us)
        return [_sampled_at(curves.device_used, t) for t in at], [_sampled_at(curves.non_torch, t) for t in at]
    readings = [phase_reading(trace, PN.INIT_DEVICE, "end"), phase_reading(trace, *after_key)]
    used = [r["total_bytes"] - r["free_bytes"] if r else None for r in readings]
    return used, [u - r["reserved_bytes"] if r else None for u, r in zip(used, readings, strict=True)]


def _init_gap(trace: Trace, formula: str) -> int | None:
    """Device memory vLLM's init snapshot did not hold yet when init_device ended (cudaMemGetInfo terms:
    from the plugin's reading at the end of init_device; NVML's "used" counts the driver's reserved
    memory too, ~615 MiB on an H200, so it is not comparable with vLLM's snapshot)."""
    snap = (trace.facts.get(F.VLLM_PROFILE) or {}).get("init_snapshot") or {}
    reading = phase_reading(trace, PN.INIT_DEVICE, "end")
    if reading is None:
        return None
    used = reading["total_bytes"] - reading["free_bytes"]
    if formula == FORMULA_025 and isinstance(snap.get("non_torch_memory"), int):
        return int(used - reading["reserved_bytes"] - snap["non_torch_memory"])
    if formula == FORMULA_033 and isinstance(snap.get("cuda_memory"), int):
        return int(used - snap["cuda_memory"])
    return None


def reconcile_kv(trace: Trace, curves: Curves | None = None, source: str | None = None) -> KvReconciliation | None:
    """memtrace's available-KV figure for a vLLM start-up trace; None when the trace lacks what it
    needs (a target; the init_device, load_model, profile_run and determine_available_memory phases;
    allocator events; NVML samples or boundary readings, per ``source``)."""
    if kv_size_given(trace):  # vLLM ran no formula: the size was handed to it
        return None
    target = trace.facts.get(F.TARGET_BYTES)
    phases = (PN.LOAD_MODEL, PN.PROFILE_RUN, PN.DETERMINE_AVAILABLE_MEMORY, PN.INIT_DEVICE)
    load, prof, dam, init = (_phase(trace, n) for n in phases)
    if not isinstance(target, int) or None in (load, prof, dam, init) or len(trace.events) == 0:
        return None
    if None in (load.end_us, prof.end_us, dam.end_us, init.end_us):
        return None
    curves = curves or all_curves(trace)
    source = source or ("nvml" if curves.has_device else "boundaries")
    formula = choose_formula(trace.facts)
    graph = _phase(trace, PN.CUDAGRAPH_PROFILE)
    if formula == FORMULA_025 or graph is None or graph.start_us < prof.end_us:
        after_us, after_key = dam.end_us, (PN.DETERMINE_AVAILABLE_MEMORY, "end")
    else:
        after_us, after_key = graph.start_us, (PN.CUDAGRAPH_PROFILE, "start")
    init_us, notes = init.end_us, []
    if source == "nvml" and curves.has_device and int(curves.device_used.time_us[0]) > init_us:
        init_us = int(curves.device_used.time_us[0])
    used, non_torch = _device(trace, curves, source, init_us, after_us, after_key)
    if None in used or None in non_torch:
        return None

    alloc = curves.allocated
    weights = alloc.at(load.end_us) - alloc.at(load.start_us)
    peak = window_max(alloc, prof.start_us, prof.end_us)
    estimate, disabled, more = _graph_estimate(trace)
    notes += more
    vllm_kv = trace.facts.get(F.VLLM_AVAILABLE_KV_BYTES)
    gap = _init_gap(trace, formula)
    common = dict(formula=formula, source=source, target_bytes=int(target), weights_bytes=int(weights),
                  peak_allocated_bytes=int(peak), graph_estimate_bytes=int(estimate),
                  vllm_available_kv_bytes=int(vllm_kv) if isinstance(vllm_kv, int) else None, init_us=int(init_us),
                  after_us=int(after_us), init_gap_bytes=gap, first_sample_delay_us=int(init_us - init.end_us),
                  graph_estimate_disabled_bytes=disabled, notes=notes)  # fmt: skip
    if formula == FORMULA_025:
        torch_peak_increase = peak - alloc.at(prof.start_us)
        non_torch_increase = non_torch[1] - non_torch[0]
        non_kv = non_torch_increase + torch_peak_increase + weights
        terms = dict(
            torch_peak_increase_bytes=int(torch_peak_increase), non_torch_increase_bytes=int(non_torch_increase)
        )
    else:
        total_consumed = used[1] - used[0]
        headroom = peak - alloc.at(after_us)
        non_kv = total_consumed + headroom
        terms = dict(total_consumed_bytes=int(total_consumed), transient_peak_headroom_bytes=int(headroom))
    non_kv += gap or 0
    # the recorded target is vLLM's ceil(util x card): the profiled formula, less the CUDA-graph estimate
    available = int(target - non_kv - estimate)
    return KvReconciliation(**common, **terms, non_kv_bytes=int(non_kv), available_kv_bytes=available)


def profiled_kv_bytes(util: float, capacity: int, non_kv: int) -> int:
    """vLLM's profiled KV sizing on a card of ``capacity``: ``ceil(util x capacity) - non_kv``, ``non_kv`` being
    what it keeps out of the KV cache (:func:`non_kv`'s figure, the CUDA-graph estimate included). The one
    formula ``fits`` and the what-if size with."""
    return math.ceil(util * capacity) - non_kv


def kv_size_given(trace: Trace) -> bool:
    """vLLM was handed the KV cache's size (``--kv-cache-memory-bytes``, or a persisted start-up plan
    under ``VLLM_ENABLE_STARTUP_PLAN=1``): it still runs ``profile_run`` but sizes nothing, so its
    formula does not apply and the KV cache has that size on any card. (vLLM 0.34's extensible KV cache
    is sized by a formula: after warm-up, ``analysis.extensible``; its profiled figure sizes the
    address range with the 0.33 formula.)"""
    source = trace.facts.get(F.VLLM_KV_SIZE_SOURCE)
    return source in (F.KV_SIZE_GIVEN_FLAG, F.KV_SIZE_GIVEN_PLAN)


#: Where :func:`non_kv`'s figure came from, in the words outputs print.
MEMTRACE = "vLLM's formula on memtrace's curves"
KV_GIVEN = "the KV cache's size was given to vLLM (no formula): target - that size"
VLLM_RECORDED = "vLLM's own recorded figure"
PRE_KV_PEAK = "the peak before any KV cache (no KV sizing recorded)"


@dataclass(frozen=True)
class NonKv:
    """What vLLM keeps out of the KV cache (target - available KV), the one figure every output shows."""

    bytes: int
    source: str  # MEMTRACE, VLLM_RECORDED, KV_GIVEN or PRE_KV_PEAK
    reconstruction: KvReconciliation | None  # the terms, when source is MEMTRACE


def non_kv(trace: Trace, curves: Curves | None = None) -> NonKv | None:
    """The authoritative non-KV figure (see the module docstring): :func:`reconcile_kv`'s
    ``withheld_bytes``, else vLLM's recorded target - available KV, else the pre-KV peak of device-level
    memory (None for a trace with no memory at all)."""
    from memtrace.analysis.analysed.landmarks import landmarks

    curves = curves or all_curves(trace)
    k = reconcile_kv(trace, curves)
    if k is not None:
        return NonKv(k.withheld_bytes, MEMTRACE, k)
    lm = landmarks(trace, curves)
    if lm.non_kv_bytes is not None:
        return NonKv(lm.non_kv_bytes, KV_GIVEN if kv_size_given(trace) else VLLM_RECORDED, None)
    moment = lm.pre_kv_peak or lm.peak
    return NonKv(moment.bytes, PRE_KV_PEAK, None) if moment is not None else None
