"""The report's section on vLLM's non-KV memory: ``analysis.reconcile.non_kv``, the one figure that
``fits`` uses too, and the terms of memtrace's reconstruction with vLLM's formula.

``out`` is ``plots.text``'s writer (``heading``/``item``); reads analysis results only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memtrace import vllm_phase_names as PN
from memtrace.analysis.capacity.reconcile import FORMULA_LABEL, KV_GIVEN, MEMTRACE, VLLM_RECORDED
from memtrace.units import gib_or_dash, signed_gib

if TYPE_CHECKING:
    from memtrace.analysis.analysed.rank import AnalysedRank


def _seconds(s: AnalysedRank, t_us: int) -> str:
    return f"{(t_us - s.origin.t0_us) / 1e6:.2f} s"


def render_non_kv(out, s: AnalysedRank) -> None:
    """The non-KV section of a report: ``s.non_kv`` and, for a reconstruction, every term."""
    n = s.non_kv
    if n is None or not s.vllm:  # a program that is not vLLM has no KV cache to keep memory out of
        return
    if n.source == MEMTRACE:
        _kv(out, s)
    else:
        out.heading("vLLM's non-KV memory (what it keeps out of the KV cache; fits uses this figure)")
        if n.source == KV_GIVEN:
            out.item(
                f"{gib_or_dash(n.bytes)} beside the KV cache: its size was given to vLLM (--kv-cache-memory-bytes "
                "or a start-up plan), so vLLM ran no formula and the cache has that size on any card"
            )
        elif n.source == VLLM_RECORDED:
            out.item(
                f"{gib_or_dash(n.bytes)}: vLLM's own figure (target - available KV, recorded); memtrace cannot "
                "reconstruct it here (a phase, NVML samples or boundary readings are missing)"
            )
        else:
            out.item(
                f"{gib_or_dash(n.bytes)}: the peak before the KV cache (reserved + non-torch); no KV sizing was "
                "recorded" + (" (the run died first)" if (s.oom is not None) else "")
            )
    _crossing_vs_sizing(out, s)


def _kv(out, s: AnalysedRank) -> None:
    k = s.non_kv.reconstruction  # render_non_kv reads it only where non_kv is memtrace's reconstruction
    formula = FORMULA_LABEL.get(k.formula, f"{k.formula} formula")
    out.heading(f"Reconciliation with vLLM's available KV cache ({formula}, device memory from {k.source})")
    if k.total_consumed_bytes is not None:
        terms = (
            f"device memory consumed since init {gib_or_dash(k.total_consumed_bytes)} + transient peak headroom "
            f"{gib_or_dash(k.transient_peak_headroom_bytes)}"
        )
    else:
        terms = (
            f"non-torch increase {gib_or_dash(k.non_torch_increase_bytes)} + torch peak increase "
            f"{gib_or_dash(k.torch_peak_increase_bytes)} + weights {gib_or_dash(k.weights_bytes)}"
        )
    if k.init_gap_bytes:
        terms += f" + before recording began {gib_or_dash(k.init_gap_bytes)}"
    out.item(f"non-KV = {terms} = {gib_or_dash(k.non_kv_bytes)}")
    out.item(
        f"available KV = target {gib_or_dash(k.target_bytes)} - non-KV - CUDA-graph estimate "
        f"{gib_or_dash(k.graph_estimate_bytes)} = {gib_or_dash(k.available_kv_bytes)} (weights {gib_or_dash(k.weights_bytes)}, "
        f"peak allocated in profile_run {gib_or_dash(k.peak_allocated_bytes)})"
    )
    out.item(
        f"vLLM keeps {gib_or_dash(k.withheld_bytes)} out of the KV cache (non-KV + CUDA-graph estimate; fits uses it)"
    )
    if k.vllm_available_kv_bytes is not None:
        out.item(
            f"vLLM reported {gib_or_dash(k.vllm_available_kv_bytes)}; memtrace's reconstruction differs by "
            f"{signed_gib(k.difference_bytes)}"
        )
    if k.init_gap_bytes:
        out.item(
            f"{gib_or_dash(k.init_gap_bytes)} appeared inside init_device after vLLM's init snapshot, before "
            "memtrace's curves begin (the plugin's reading at its end): vLLM counts it, so does non-KV above"
        )
    if k.first_sample_delay_us:
        out.item(
            f"first NVML sample {k.first_sample_delay_us / 1e3:.1f} ms after init_device ended: used as the init snapshot"
        )
    if k.graph_estimate_disabled_bytes is not None:
        out.item(
            f"CUDA-graph estimate {gib_or_dash(k.graph_estimate_disabled_bytes)} not applied "
            "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0)"
        )
    for n in k.notes:
        if "not applied" not in n:
            out.item(n)


def _crossing_vs_sizing(out, s: AnalysedRank) -> None:
    k = s.non_kv.reconstruction
    if k is not None and s.crossing_list:
        c = min(s.crossing_list, key=lambda c: c.time_us)
        when = f"at {_seconds(s, c.time_us)}" + (f" in {c.phase_path}" if c.phase_path else "")
        if c.time_us >= k.after_us:
            out.item(
                f"the target was first crossed after vLLM had sized the KV cache ({when}): its budget left no room for it"
            )
        else:  # named by the phase it happened in: loading the weights is not profiling
            profiling = any(n in c.phase_path for n in (PN.PROFILE_RUN, PN.DETERMINE_AVAILABLE_MEMORY))
            during = "while profiling" if profiling else f"in {c.phase_path}" if c.phase_path else "outside any phase"
            out.item(
                f"the target was first crossed {during}, before the KV cache was sized (at {_seconds(s, c.time_us)})"
            )
