"""Every allocation gets one category, and the category curves add up to the allocated curve exactly.

Uses the SYNTHETIC vLLM-shaped start-up of tests/synthetic_startup.py (figures known by construction)
and, where present, the real H200 traces under tests/data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import synthetic_startup
from memtrace.analysis.memory.categories import (
    ACTIVATIONS,
    CATEGORIES,
    CUDAGRAPH,
    KV_CACHE,
    OTHER,
    WEIGHTS,
    WORKSPACE,
    categorize,
    classify,
    phase_categories,
)
from memtrace.model import ACTION_CODE, HookCall, Phase, Trace, empty_events
from references import allocated_curve, category_curves
from testdata import data_name, unpacked
from testdata import real_traces as _real_traces

TESTS = Path(__file__).resolve().parents[1]
GiB, MiB = 1024**3, 1024**2


def _synthetic():
    return synthetic_startup


@pytest.fixture(scope="module")
def startup():
    return _synthetic().synthetic_startup()


def test_category_curves_add_up_to_the_allocated_curve_at_every_event(startup):
    curves = category_curves(startup)
    total = sum(curves[name].bytes for name in CATEGORIES)
    alloc = allocated_curve(startup)
    assert np.array_equal(curves["weights"].time_us, alloc.time_us)
    assert np.array_equal(total, alloc.bytes)


def test_synthetic_startup_ends_with_the_figures_it_was_built_with(startup):
    end = {name: int(c.bytes[-1]) for name, c in category_curves(startup).items()}
    assert end == {
        "weights": 24 * GiB,
        "kv_cache": 14 * GiB,
        "flashinfer_workspace": 4 * GiB,
        "cudagraph_pool": 512 * MiB,
        "activations": 0,
        "other": 20 * MiB,
    }


def test_the_transient_activation_at_the_crossing_counts_as_activations(startup):
    s = _synthetic()
    curves = category_curves(startup)
    t = s.T0 + 18_000_000
    assert curves["activations"].at(t) == 14 * GiB
    assert curves["activations"].at(t + 40_000) == 0


def test_allocations_inside_a_hook_call_are_flashinfer_workspace_whatever_the_phase():
    trace = Trace(
        phases=[Phase("load_model", 0, 100)],
        hook_calls=[HookCall("flashinfer.x:allocate_sm120_dynamic_workspace", 10, 20)],
    )
    codes = classify(trace, np.array([5, 10, 15, 20, 21]), np.zeros(5, dtype=np.int64))
    assert codes.tolist() == [WEIGHTS, WORKSPACE, WORKSPACE, WORKSPACE, WEIGHTS]


def test_kv_cache_made_while_profiling_is_transient_not_kv_cache():
    trace = Trace(
        phases=[
            Phase("determine_available_memory", 0, 100),
            Phase("cudagraph_profile", 10, 50, parent=0),
            Phase("initialize_kv_cache", 20, 30, parent=1),  # a user marking vLLM's is_profiling call
            Phase("initialize_from_config", 100, 200),
            Phase("kv_cache_init", 110, 190, parent=3),
            Phase("init_device", 200, 210),
            Phase("my_user_phase", 300, 400),
        ]
    )
    assert phase_categories(trace) == [ACTIVATIONS, CUDAGRAPH, ACTIVATIONS, KV_CACHE, KV_CACHE, OTHER, ACTIVATIONS]
    assert classify(trace, np.array([25, 150, 500]), np.zeros(3, dtype=np.int64)).tolist() == [
        ACTIVATIONS,
        KV_CACHE,
        OTHER,
    ]


def test_blocks_in_a_private_pool_are_cudagraph_pool_even_outside_capture(startup):
    s = _synthetic()
    graph_seg = [seg for seg in startup.segments if seg.pool_id == "2,0"][0]
    code = classify(startup, np.array([s.T0 + 60_000_000]), np.array([graph_seg.address]))
    assert code.tolist() == [CUDAGRAPH]


def test_a_free_of_memory_allocated_before_recording_comes_out_of_other():
    ev = empty_events(2)
    ev[0] = (10, ACTION_CODE["free_completed"], 0x1000, 4096, 0, -1)
    ev[1] = (20, ACTION_CODE["alloc"], 0x2000, 100, 0, -1)
    trace = Trace(events=ev, phases=[Phase("load_model", 0, 100)])
    assert categorize(trace).codes.tolist() == [OTHER, WEIGHTS]
    curves = category_curves(trace)
    assert curves["other"].bytes.tolist() == [4096, 0, 0]
    assert curves["weights"].bytes.tolist() == [0, 0, 100]


def test_an_empty_trace_has_flat_zero_category_curves():
    curves = category_curves(Trace())
    assert all(c.bytes.tolist() == [0] for c in curves.values())


@pytest.mark.parametrize("path", _real_traces(), ids=data_name)
def test_real_trace_categories_add_up_and_weights_come_from_load_model(path):
    from memtrace.store import load_trace

    trace = load_trace(path)
    curves = category_curves(trace)
    assert np.array_equal(sum(curves[n].bytes for n in CATEGORIES), allocated_curve(trace).bytes)
    if any(p.name == "load_model" for p in trace.phases) and len(trace.events):
        assert curves["weights"].peak_bytes > 0


H200 = TESTS / "data" / "h200"


def _h200(name: str):
    from memtrace.store import load_run

    if not (H200 / name).is_dir():
        pytest.skip(f"no real trace tests/data/h200/{name}")
    return load_run(H200 / name).traces[0]


def _torch_counters(trace) -> dict[str, dict]:
    return {c["phase"]: c for c in trace.facts.get("torch_counters") or []}


def test_real_h200_weights_and_kv_cache_match_torchs_own_counters():
    trace = _h200("startup-full")
    counters = _torch_counters(trace)
    curves = category_curves(trace)
    end = {p.name: p.end_us for p in trace.phases}
    loaded = counters["load_model"]["memory_allocated"] - counters["init_device"]["memory_allocated"]
    kv = counters["kv_cache_init"]["memory_allocated"] - counters["determine_available_memory"]["memory_allocated"]
    # torch counts blocks rounded up to 512 B; the trace counts requested bytes
    assert curves["weights"].at(end["load_model"]) == pytest.approx(loaded, rel=0.01)
    assert curves["kv_cache"].at(end["kv_cache_init"]) == pytest.approx(kv, rel=0.001)


def test_real_h200_workspace_is_found_by_stack_without_hook_calls_and_grows_by_the_extra_gib():
    full, ws = _h200("startup-full"), _h200("startup-ws1g")
    assert not full.hook_calls  # recorded without hooks: the stack rule finds the allocator
    grow = (
        category_curves(ws)["flashinfer_workspace"].bytes[-1] - category_curves(full)["flashinfer_workspace"].bytes[-1]
    )
    assert grow == GiB  # the recording added --workspace-extra 1GiB to one workspace


def test_real_h200_graph_pool_blocks_are_cudagraph_pool():
    trace = _h200("startup-full")
    curves = category_curves(trace)
    graph_blocks = sum(
        b.requested_bytes
        for s in trace.segments
        if s.pool_id != "0,0"
        for b in s.blocks
        if b.state.startswith("active")
    )
    assert graph_blocks > 0 and curves["cudagraph_pool"].bytes[-1] >= graph_blocks


def test_real_vllm_kv_cache_and_weights_categories_match_vllms_own_figures():
    from memtrace.store import load_run

    run = unpacked(TESTS / "data" / "vllm-h200" / "startup")
    if not run.is_dir():
        pytest.skip("no real vLLM trace under tests/data/vllm-h200")
    trace = load_run(run).traces[0]
    curves = category_curves(trace)
    assert curves["kv_cache"].bytes[-1] == pytest.approx(trace.facts["vllm.kv_cache_bytes"], abs=1024)
    assert curves["weights"].bytes[-1] == pytest.approx(trace.facts["vllm.weights_memory_bytes"], rel=0.001)
    assert curves["cudagraph_pool"].bytes[-1] > 0  # capture_model's private pool


def test_category_steps_read_the_category_curves_at_any_index_without_building_them():
    """The view's zoom reads categories at a few thousand indices (analysis.categories.CategorySteps)."""
    import numpy as np
    from memtrace.analysis.analysed.run import analyse
    from memtrace.analysis.memory.categories import CATEGORIES, category_steps
    from memtrace.store import load_run
    from references import category_curves

    rank = analyse(load_run(unpacked(TESTS / "data" / "vllm-h200" / "startup")).traces).ranks[0]
    steps = category_steps(rank.trace, rank.categorized, rank.curves)
    idx = np.r_[0, np.random.default_rng(0).integers(0, len(rank.trace.events) + 1, 500), len(rank.trace.events)]
    curves = category_curves(rank.trace, rank.categorized, curves=rank.curves)
    want = np.array([curves[c].bytes[idx] for c in CATEGORIES])
    assert rank.category_steps is rank.category_steps  # computed once on the rank, shared by plot and view
    assert np.array_equal(steps.at(idx), want)
