"""diff across vLLM versions compares like with like (issue 32, defect 1): vLLM 0.34 commits its KV cache
through CUDA's VMM API, outside PyTorch, so "reserved" there is PyTorch's alone; what the process held is
its own row, and the categories read at that moment agree with the headline's KV cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memtrace.cli import main
from testdata import unpacked, unpacked_dir
from vllm034_data import run_dir

STARTUP = unpacked(Path(__file__).resolve().parents[1] / "data" / "vllm-h200" / "startup")  # vLLM 0.25.1, KV in PyTorch


def _json(capsys, *argv) -> dict:
    main([str(a) for a in argv])
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def moe_ext() -> Path:
    return run_dir("moe-ext")


def test_diff_calls_reserved_what_the_report_calls_reserved_and_holds_the_vmm_kv_cache_apart(capsys, moe_ext):
    report = _json(capsys, "report", moe_ext, "--json")["traces"][0]
    d = _json(capsys, "diff", STARTUP, moe_ext, "--json")["traces"][0]
    head = {c["label"]: c for c in d["headline"]}
    assert head["peak reserved"]["new_bytes"] == report["peak"]["reserved_bytes"] == 12_597_592_064
    assert head["peak held by this process"]["new_bytes"] == report["peak_held"]["bytes"] == 147_482_214_400
    # PyTorch's own figures fall by ~91% because the KV cache left PyTorch: shown, said so, not gated
    for label in ("peak reserved", "peak allocated"):
        assert head[label]["limit_bytes"] is None and "moved outside PyTorch" in head[label]["note"]
    assert head["peak held by this process"]["limit_bytes"] is not None and head["peak held by this process"]["over"]


def test_the_kv_cache_by_category_agrees_with_the_headlines_kv_cache_in_both_runs(capsys, moe_ext):
    d = _json(capsys, "diff", STARTUP, moe_ext, "--json")["traces"][0]
    kv = {c["label"]: c for c in d["headline"]}["KV cache"]
    cat = {c["label"]: c for c in d["categories"]}["kv_cache"]
    assert (
        (cat["base_bytes"], cat["new_bytes"])
        == (kv["base_bytes"], kv["new_bytes"])
        == (125_653_221_636, 135_543_226_662)
    )


def test_the_text_says_once_that_the_kv_cache_moved_and_never_that_reserved_counts_it(capsys, moe_ext):
    main(["diff", str(STARTUP), str(moe_ext)])
    out = capsys.readouterr().out
    assert out.count("The KV cache moved: allocated through PyTorch's allocator → CUDA's VMM API") == 1
    assert "reserved counts the KV cache" not in out
    assert "kv_cache                  117.02 GiB →  126.23 GiB" in out


def test_two_stack_rows_under_one_printed_frame_each_show_the_frame_that_tells_them_apart(capsys):
    main(["diff", str(run_dir("moe-noext")), str(run_dir("moe-ext"))])
    rows = [line for line in capsys.readouterr().out.split("By allocating stack")[1].splitlines() if "→" in line]
    shown = [line.split("GiB  ", 2)[-1] for line in rows]  # the printed frame, and its "via" when it has one
    frames = [s.split("  via ")[0] for s in shown]
    twice = {f for f in frames if frames.count(f) > 1}
    assert "_ensure_workspace_size (worker/workspace.py:309)" in twice  # new +512 MiB and gone -512 MiB
    for f in twice:
        vias = [s.split("  via ", 1)[1] for s in shown if s.split("  via ")[0] == f]
        assert len(vias) == frames.count(f) and len(set(vias)) == len(vias)  # each row its own caller


def test_the_per_phase_table_names_the_curve_its_peaks_are_read_from(capsys, moe_ext):
    """It said "Per phase (peak):" above 0.25.1's kv_cache_init 128.92 GiB beside 0.34's 11.76 GiB, naming no
    quantity; its peaks are the headline's curve (reserved + the VMM KV cache + non-PyTorch), said so."""
    main(["diff", str(STARTUP), str(moe_ext)])
    out = capsys.readouterr().out
    level = "PyTorch reserved + the KV cache outside PyTorch (CUDA VMM) + non-PyTorch memory"
    assert f"Headline — {level}:" in out
    assert f"Per phase (peak of {level}, less the KV cache: it moved, and the runs make it in other phases):" in out
    assert "  kv_cache_extend: only in the new run" in out


def test_a_kv_cache_moved_into_pytorch_is_said_so_and_its_phases_compare_held_less_the_kv_cache(capsys, moe_ext):
    """issue 41, item 4: moe-ext (CUDA VMM, committed after warm-up) -> moe-noext (PyTorch, in kv_cache_init)."""
    d = _json(capsys, "diff", moe_ext, run_dir("moe-noext"), "--json")["traces"][0]
    head = {c["label"]: c for c in d["headline"]}
    for label in ("peak reserved", "peak allocated"):
        assert (
            head[label]["limit_bytes"] is None and head[label]["note"] == "not gated: the KV cache moved into PyTorch"
        )
    assert head["post-KV transient"]["limit_bytes"] is None  # 0 by construction where warm-up came first
    phases = {p["path"]: p for p in d["phases"]}
    kv_init = phases["kv_cache_init"]
    # both less their KV cache: 11.75 GiB -> 11.76 GiB, not 11.75 -> 128.94 GiB
    assert abs(kv_init["new_bytes"] - kv_init["base_bytes"]) < 16 * 2**20, kv_init
    assert not any(p["over"] for p in d["phases"])
    main(["diff", str(moe_ext), str(run_dir("moe-noext"))])
    out = capsys.readouterr().out
    assert "moved outside PyTorch" not in out and out.count("(not gated: the KV cache moved into PyTorch)") == 2
    assert ", less the KV cache: it moved, and the runs make it in other phases):" in out


def test_the_samplers_buffers_made_while_loading_the_model_are_not_weights(capsys, moe_ext):
    """issue 41, item 4: penalties.py's buffers (sized by max_num_seqs) grew weights 10.46 -> 10.61 GiB."""
    d = _json(capsys, "diff", moe_ext, unpacked_dir("vllm-h200-034-grid/g07"), "--json")["traces"][0]
    weights = {c["label"]: c for c in d["categories"]}["weights"]
    assert abs(weights["new_bytes"] - weights["base_bytes"]) < 8 * 2**20, weights
