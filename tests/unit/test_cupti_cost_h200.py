"""CUPTI's own device memory, measured on the H200 (tests/data/vllm-h200/README.md, "CUPTI"): the same warm vLLM
0.25.1 start-up with the plugin alone (`cost-round4-on`) and with the plugin and CUPTI (`cost-round4-cupti`), one
minute apart on one machine. CUPTI's buffers add 12,582,912 B of non-PyTorch memory, and vLLM's KV cache is smaller
by exactly that: the reason the source stays off by default."""

import csv
from pathlib import Path

from memtrace.analysis.analysed.landmarks import landmarks, steady_non_torch
from memtrace.analysis.memory.curves import all_curves
from memtrace.store import load_trace

HERE = Path(__file__).parents[1] / "data" / "vllm-h200"
CUPTI_BYTES = 12_582_912
KV_BYTES_PER_TOKEN = 8 * 2 * 4 * 128 * 1  # layers x (K, V) x KV heads x head_dim x fp8


def _figures(mode: str):
    t = load_trace(next((HERE / f"cost-round4-{mode}").glob("*.memtrace.xz")))
    c = all_curves(t)
    steady = steady_non_torch(c)
    return t, landmarks(t, c), int(steady.bytes[0]), int(steady.bytes.max())


def test_cuptis_own_buffers_shrink_vllms_kv_cache_by_exactly_their_size():
    on, lm_on, start_on, top_on = _figures("on")
    cupti, lm_cupti, start_cupti, top_cupti = _figures("cupti")
    assert "cupti" not in on.facts and cupti.facts["cupti"]["records"] == 1554
    assert start_on == start_cupti == 722_272_256  # the same CUDA context when recording began
    assert top_cupti - top_on == CUPTI_BYTES  # CUPTI's buffers, grown while recording, seen by NVML only
    assert lm_cupti.before_kv_non_torch_bytes - lm_on.before_kv_non_torch_bytes == CUPTI_BYTES
    assert lm_on.kv_cache_bytes - lm_cupti.kv_cache_bytes == CUPTI_BYTES  # vLLM gave them to CUPTI


def test_the_analysis_names_cuptis_own_bytes_from_the_cupti_run_alone():
    from memtrace.analysis.memory import non_torch

    cupti = _figures("cupti")[0]
    assert (
        non_torch.cupti_own_bytes(cupti, all_curves(cupti)) == CUPTI_BYTES
    )  # what the run without CUPTI shows is missing
    on = _figures("on")[0]
    assert non_torch.cupti_own_bytes(on, all_curves(on)) is None  # no CUPTI records: nothing to name


def test_vllms_own_log_says_the_same_in_tokens():
    rows = list(csv.DictReader((HERE / "cost-cupti-runs.tsv").open(), delimiter="\t"))
    tokens = {}
    for r in rows:
        figure = r["vllm_figures"].split("GPU KV cache size: ", 1)[1].split(" tokens", 1)[0]
        tokens.setdefault(r["mode"], set()).add(int(figure.replace(",", "")))
    assert tokens == {"off": {15_338_528}, "on": {15_338_528}, "cupti": {15_336_992}}
    assert (15_338_528 - 15_336_992) * KV_BYTES_PER_TOKEN == CUPTI_BYTES


def test_diff_says_a_run_with_cupti_does_not_compare_with_one_without():
    from memtrace.units import parse_threshold
    from references import diff_traces

    on, cupti = _figures("on")[0], _figures("cupti")[0]
    d = diff_traces(on, cupti, parse_threshold("5%"))
    assert d.setup_changes == [("cupti", "—", "on")] and not d.comparable
    before = {c.label: c for c in d.headline}["memory before KV sizing"]
    assert before.new - before.base == CUPTI_BYTES  # the whole difference, named by the setup line
