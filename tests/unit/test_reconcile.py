"""memtrace's reconstruction of vLLM's available-KV figure, term by term.

Small hand-made traces with round numbers check each formula; the real H200 trace (vLLM 0.25.1 +
FlashInfer 0.6.13) checks the agreement with vLLM's own figure and its log line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from memtrace.analysis.capacity.reconcile import FORMULA_025, FORMULA_033, choose_formula, reconcile_kv
from memtrace.model import ACTION_CODE, Phase, Trace, empty_events, empty_samples
from testdata import unpacked

REAL = Path(__file__).resolve().parents[1] / "data" / "vllm-h200"
GiB = 1 << 30


def _relative(r) -> float:
    """|memtrace's available KV bytes - vLLM's| / vLLM's."""
    return abs(r.difference_bytes) / abs(r.vllm_available_kv_bytes)


def _trace(events, samples, facts) -> Trace:
    ev = empty_events(len(events))
    for i, (t, action, addr, size) in enumerate(events):
        ev[i]["time_us"], ev[i]["action"], ev[i]["addr"], ev[i]["size"] = t, ACTION_CODE[action], addr, size
    sm = empty_samples(len(samples))
    for i, (t, used) in enumerate(samples):
        sm[i]["time_us"], sm[i]["used_bytes"] = t, used
    phases = [
        Phase("init_device", 0, 10, None, "vllm"),
        Phase("load_model", 20, 30, None, "vllm"),
        Phase("determine_available_memory", 40, 100, None, "vllm"),
        Phase("profile_run", 41, 80, 2, "vllm"),
        Phase("cudagraph_profile", 81, 95, 2, "vllm"),
    ]
    base = {"target_bytes": 10_000, "vllm.cudagraph_memory_estimate_bytes": 300}
    return Trace(events=ev, samples=sm, phases=phases, facts={**base, **facts})


WEIGHTS = [(25, "segment_alloc", 0x1000, 2000), (25, "alloc", 0x1000, 1000)]
PROFILE = [(50, "segment_alloc", 0x9000, 4000), (50, "alloc", 0x9000, 3000), (60, "free_completed", 0x9000, 3000)]


def test_vllm_025_formula_adds_non_torch_increase_torch_peak_and_weights():
    # empty_cache at the end of memory_profiling (after the graph profile in 0.25): segment_free at 99
    events = WEIGHTS + PROFILE + [(99, "segment_free", 0x9000, 4000)]
    samples = [(11, 500), (26, 2500), (51, 6700), (99, 2700)]  # non-torch 500 -> 700 during profile_run
    trace = _trace(
        events, samples, {"vllm.profile": {"non_torch_memory_bytes": 200}, "vllm.available_kv_cache_bytes": 5500}
    )
    r = reconcile_kv(trace)
    assert r.formula == FORMULA_025 and r.source == "nvml"
    assert (r.weights_bytes, r.torch_peak_increase_bytes, r.non_torch_increase_bytes) == (1000, 3000, 200)
    assert r.non_kv_bytes == 4200 and r.graph_estimate_bytes == 300
    assert r.available_kv_bytes == 10_000 - 4200 - 300 == 5500
    assert r.difference_bytes == 0 and _relative(r) == 0.0
    assert r.init_us == 11 and r.after_us == 100


def test_vllm_033_formula_uses_total_consumed_and_the_transient_headroom():
    # empty_cache before the graph profile (0.33): segment_free at 80.5 -> after = cudagraph_profile start
    events = WEIGHTS + PROFILE + [(80, "segment_free", 0x9000, 4000)]
    samples = [(11, 500), (26, 2500), (51, 6700), (80, 2700)]
    trace = _trace(
        events, samples, {"vllm.profile": {"total_consumed_bytes": 2200}, "vllm.available_kv_cache_bytes": 4400}
    )
    r = reconcile_kv(trace)
    assert r.formula == FORMULA_033 and r.after_us == 81
    assert (r.total_consumed_bytes, r.transient_peak_headroom_bytes) == (2200, 3000)
    assert r.available_kv_bytes == 10_000 - 5200 - 300 == 4500
    assert r.difference_bytes == 100 and _relative(r) == pytest.approx(100 / 4400)


def test_boundary_readings_stand_in_for_nvml_samples():
    events = WEIGHTS + PROFILE + [(99, "segment_free", 0x9000, 4000)]
    readings = [  # what the plugin reads with cudaMemGetInfo + memory_reserved at the phase edges
        {"phase": "init_device", "edge": "end", "free_bytes": 9500, "total_bytes": 10_000, "reserved_bytes": 0},
        {
            "phase": "determine_available_memory",
            "edge": "end",
            "free_bytes": 7300,
            "total_bytes": 10_000,
            "reserved_bytes": 2000,
        },
    ]
    trace = _trace(events, [], {"vllm.version": "0.25.1", "memtrace.phase_memory": readings})
    r = reconcile_kv(trace)
    assert r.source == "boundaries" and r.non_torch_increase_bytes == 200 and r.available_kv_bytes == 5500
    trace.facts["memtrace.phase_memory"] = readings[:1]
    assert reconcile_kv(trace) is None


def test_a_disabled_graph_estimate_is_not_subtracted():
    events = WEIGHTS + PROFILE + [(99, "segment_free", 0x9000, 4000)]
    samples = [(11, 500), (26, 2500), (51, 6700), (99, 2700)]
    facts = {"vllm.version": "0.25.1", "env": {"environ": {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"}}}
    r = reconcile_kv(_trace(events, samples, facts))
    assert r.graph_estimate_bytes == 0 and r.available_kv_bytes == 5800
    assert any("not applied" in n for n in r.notes)


def test_formula_follows_vllms_own_attributes_then_its_version():
    assert choose_formula({"vllm.profile": {"non_torch_memory_bytes": 1}}) == FORMULA_025
    assert choose_formula({"vllm.profile": {"total_consumed_bytes": 1}, "vllm.version": "0.25.1"}) == FORMULA_033
    assert choose_formula({"vllm.version": "0.25.1"}) == FORMULA_025
    assert choose_formula({"vllm.version": "0.33.0"}) == FORMULA_033


def test_a_trace_without_samples_or_phases_is_not_reconciled():
    events = WEIGHTS + PROFILE
    assert reconcile_kv(_trace(events, [], {})) is None
    trace = _trace(events, [(11, 500)], {})
    trace.phases = trace.phases[:2]
    assert reconcile_kv(trace) is None


def _real_trace():
    from memtrace.store import load_run

    return load_run(unpacked(REAL / "startup")).traces[0]


def test_real_h200_trace_matches_vllms_available_kv_within_one_percent():
    trace = _real_trace()
    profile = trace.facts["vllm.profile"]  # vLLM's own figures, read from its worker
    vllm_bytes = trace.facts["vllm.available_kv_cache_bytes"]
    log = (REAL / "startup" / "vllm.log").read_text(errors="replace")
    logged_gib = float(re.search(r"Available KV cache memory: ([\d.]+) GiB", log).group(1))
    assert logged_gib == 117.02 and vllm_bytes == 125_653_349_991
    for source in ("nvml", "boundaries"):
        r = reconcile_kv(trace, source=source)
        assert r.formula == FORMULA_025 and r.source == source and r.vllm_available_kv_bytes == vllm_bytes
        # 117.02 GiB: the init-gap term (below) counted, as vLLM counts it; 117.18 GiB without it
        assert r.available_kv_bytes == 125_654_418_919
        assert _relative(r) < 0.01 and abs(r.available_kv_bytes / GiB - logged_gib) / logged_gib < 0.01
        # term by term against vLLM's own worker attributes
        assert r.torch_peak_increase_bytes == profile["peak_activation_memory_bytes"] == 897_581_056
        assert r.weights_bytes == pytest.approx(profile["weights_memory_bytes"], rel=1e-4)
        assert r.graph_estimate_bytes == profile["cudagraph_memory_estimate_bytes"] == 47_185_920
        assert r.non_torch_increase_bytes == 73_400_320  # vLLM: 243,269,632, from an earlier snapshot
        # non-torch memory created inside init_device after vLLM's snapshot, before memtrace's curves
        # begin, is a term of non-KV (vLLM counts it); what is left is requested-vs-rounded weight bytes
        assert r.init_gap_bytes == profile["non_torch_memory_bytes"] - r.non_torch_increase_bytes == 169_869_312
        assert (
            r.non_kv_bytes == r.non_torch_increase_bytes + r.torch_peak_increase_bytes + r.weights_bytes + 169_869_312
        )
        assert r.difference_bytes == profile["weights_memory_bytes"] - r.weights_bytes == 1_068_928
        assert r.withheld_bytes == r.target_bytes - r.available_kv_bytes == r.non_kv_bytes + r.graph_estimate_bytes


def test_non_kv_is_one_figure_with_the_reconstruction_first_then_vllms_then_the_pre_kv_peak():
    from memtrace.analysis.capacity.reconcile import MEMTRACE, PRE_KV_PEAK, VLLM_RECORDED, non_kv
    from memtrace.store import load_run

    trace = _real_trace()
    n = non_kv(trace)
    assert (n.source, n.bytes) == (MEMTRACE, n.reconstruction.withheld_bytes)
    # within 1 MiB of vLLM's own target - available KV (12,447,739,904 B = 11.59 GiB)
    assert abs(n.bytes - (trace.facts["target_bytes"] - trace.facts["vllm.available_kv_cache_bytes"])) == 1_068_928
    del trace.facts["memtrace.phase_memory"], trace.facts["vllm.profile"]  # no readings, no vLLM attributes
    trace.samples = trace.samples[:0]  # and no NVML: nothing to reconstruct from
    n = non_kv(trace)
    assert (n.source, n.bytes) == (VLLM_RECORDED, 12_447_739_904)
    died = load_run(REAL.parent / "h200" / "startup-cap6g").traces[0]  # died in profile_run: no sizing
    assert non_kv(died).source == PRE_KV_PEAK


def test_a_given_kv_size_is_not_reconstructed_and_fits_keeps_it_on_every_card():
    # --kv-cache-memory-bytes / VLLM_ENABLE_STARTUP_PLAN: vLLM runs profile_run but no formula (vLLM 0.32's
    # determine_available_memory); the KV cache has the given size on any card
    from capacity_model import fit
    from memtrace import facts as F
    from memtrace.analysis.capacity.reconcile import KV_GIVEN, non_kv, reconcile_kv
    from memtrace.store import load_run

    trace = load_run(unpacked(REAL / "startup-stacks")).traces[0]
    given = trace.facts[F.VLLM_AVAILABLE_KV_BYTES]
    assert reconcile_kv(trace) is not None
    trace.facts[F.VLLM_KV_SIZE_SOURCE] = "--kv-cache-memory-bytes"
    assert reconcile_kv(trace) is None
    nk = non_kv(trace)
    assert nk.source == KV_GIVEN and nk.bytes == trace.facts[F.TARGET_BYTES] - given
    for capacity in (150 << 30, 200 << 30):  # the given size, in whole blocks: the bytes vLLM allocated
        f = fit(trace, capacity)
        assert f.kv_available_bytes == given and f.kv_cache_bytes == trace.facts[F.VLLM_KV_BYTES] < given


def test_every_sizing_mode_the_plugin_records_is_known_by_name_and_in_words():
    """The plugin's four answers for how vLLM sized the KV cache (``facts.KV_*``) are the ones analysis tells
    apart: two are a size handed to vLLM, and each has words for "vLLM's default with ...". An earlier
    table had words for "given", a value the plugin never writes."""
    from memtrace import facts as F
    from memtrace.analysis.capacity.reconcile import kv_size_given
    from memtrace.analysis.memory.target import KV_SIZING_WORDS
    from memtrace.model import Trace

    modes = (F.KV_SIZED_BY_PROFILING, F.KV_SIZED_EXTENSIBLE, F.KV_SIZE_GIVEN_FLAG, F.KV_SIZE_GIVEN_PLAN)
    assert set(KV_SIZING_WORDS) == set(modes)
    given = []
    for mode in (*modes, None, ""):
        trace = Trace()
        trace.facts[F.VLLM_KV_SIZE_SOURCE] = mode
        given.append(kv_size_given(trace))
    assert given == [False, False, True, True, False, False]
