"""memtrace issue: a Markdown bundle for an upstream issue, with the timeline and flame images beside it.
Synthetic start-ups (named so); real H200 traces when they exist under tests/data/h200."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import synthetic_gates as g
from memtrace.cli import main
from memtrace.store import save_trace
from testdata import unpacked

TESTS = Path(__file__).resolve().parents[1]
GiB = g.GiB


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("issue")
    run = save_trace(g.vllm_like_startup(extra_workspace=GiB), d / "run.memtrace")
    assert main(["issue", str(run), "-o", str(d / "bundle")]) == 0
    return d / "bundle"


def test_bundle_holds_markdown_and_images(bundle):
    assert (bundle / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (bundle / "flame.svg").read_text().lstrip().startswith("<?xml")
    assert (bundle / "flame.folded").stat().st_size > 0
    md = (bundle / "issue.md").read_text()
    assert "![GPU memory during start-up](timeline.png)" in md
    assert "![flame graph at the reserved peak](flame.svg)" in md


def test_markdown_carries_the_environment_fingerprint(bundle):
    md = (bundle / "issue.md").read_text()
    for row in (
        "| GPU | SYNTHETIC GPU |",
        "| compute capability | 9.0 |",
        "| driver | 580.0 |",
        "| CUDA | 13.0 |",
        "| torch | 2.11.0 |",
        "| vLLM | 0.25.1 |",
        "| FlashInfer | 0.6.13 |",
        "| --gpu-memory-utilization | 0.92 |",
    ):
        assert row in md
    assert "vllm serve synthetic/model --gpu-memory-utilization 0.92" in md


def test_markdown_summarises_peak_kv_sizing_and_holders(bundle):
    md = (bundle / "issue.md").read_text()
    assert "Memory in use before KV sizing: 23.90 GiB." in md
    assert "vLLM's available KV cache: 14.26 GiB." in md
    # the per-phase table (nested phases carry a visible marker: GitHub strips leading spaces in cells)
    assert re.search(r"\| (↳ )?profile_run \| 5\.40 \| 6\.53 \|", md)
    assert "allocate_extra_workspace" in md  # a top holder at the peak
    assert "allocate_sm120_dynamic_workspace" in md  # the hook call


def test_existing_bundle_is_not_overwritten_without_force(bundle, tmp_path, capsys):
    run = save_trace(g.vllm_like_startup(), tmp_path / "run.memtrace")
    assert main(["issue", str(run), "-o", str(bundle)]) == 2
    assert "already holds issue.md" in capsys.readouterr().err
    assert main(["issue", str(run), "-o", str(bundle), "--force"]) == 0


def test_oom_run_says_it_died(tmp_path):
    run = save_trace(g.vllm_like_startup(oom_in="profile_run"), tmp_path / "oom.memtrace")
    assert main(["issue", str(run), "-o", str(tmp_path / "b")]) == 0
    md = (tmp_path / "b" / "issue.md").read_text()
    assert re.search(
        r"\n\*\*DIED: the process ran out of CUDA memory at [\d.]+ s in determine_available_memory/profile_run "
        r"\(requested 2\.00 GiB",
        md,
    )


H200_FULL = TESTS / "data" / "h200" / "startup-full"


@pytest.mark.skipif(not H200_FULL.is_dir(), reason="no real H200 run under tests/data/h200 yet")
def test_real_h200_bundle_names_the_gpu_and_the_warm_up_crossing(tmp_path):
    assert main(["issue", str(H200_FULL), "-o", str(tmp_path / "b")]) == 0
    md = (tmp_path / "b" / "issue.md").read_text()
    assert "| GPU | NVIDIA H200 |" in md and "| compute capability | 9.0 |" in md and "| driver | 580.159.04 |" in md
    assert (
        "Device used by this process first crossed the target (128.62 GiB) in `compile_or_warm_up/kernel_warmup`" in md
    )
    assert "vLLM's available KV cache: 121.72 GiB." in md


VLLM_RUN = unpacked(TESTS / "data" / "vllm-h200" / "startup")


def test_real_vllm_bundle_holds_no_local_paths_and_a_title_from_facts(tmp_path):
    assert main(["issue", str(VLLM_RUN), "-o", str(tmp_path / "b")]) == 0
    md = (tmp_path / "b" / "issue.md").read_text()
    assert md.startswith("## GPU memory during start-up: Qwen3MoeForCausalLM, vLLM 0.25.1, NVIDIA H200")
    for local in ("/tmp/", "/opt/", str(TESTS), "/work/", "/root/"):
        assert local not in md, local


def test_failed_bundle_leaves_no_folder_behind(tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["issue", str(VLLM_RUN), "-o", str(out), "--rank", "9"]) == 2
    assert not out.exists()
    assert "has no rank 9" in capsys.readouterr().err


def test_bundle_inside_the_run_is_refused(tmp_path, capsys):
    trace = next(VLLM_RUN.glob("*.memtrace"))
    assert main(["issue", str(trace), "-o", str(trace)]) == 2
    assert "input" in capsys.readouterr().err


def test_plot_of_dot_inside_a_run_is_named_after_the_run(tmp_path, monkeypatch, capsys):
    # issue 10 defect 10: `cd RUN && memtrace plot .` wrote "-timeline.png" titled "GPU memory during start-up:"
    import shutil

    run = tmp_path / "startup"
    shutil.copytree(VLLM_RUN, run)
    monkeypatch.chdir(run)
    assert main(["plot", "."]) == 0
    assert main(["issue", "."]) == 0
    assert (run / "startup-timeline.png").exists() and (run / "startup-issue" / "issue.md").exists()
    md = (run / "startup-issue" / "issue.md").read_text()
    assert md.startswith("## GPU memory during start-up: Qwen3MoeForCausalLM, vLLM 0.25.1, NVIDIA H200")


@pytest.mark.parametrize(
    "given, source",
    [([], "the recorded --gpu-memory-utilization 0.92"), (["--util", "0.5"], "--util 0.5 x the card")],
    ids=["recorded", "util"],
)
def test_the_bundle_says_where_the_target_came_from_as_the_report_does(given, source, tmp_path, capsys):
    # issue 21: the bundle passed bare bytes and the report section said "from: --target" for every target
    assert main(["issue", str(H200_FULL), "-o", str(tmp_path / "b"), *given]) == 0
    md = (tmp_path / "b" / "issue.md").read_text()
    assert f"- from: {source}" in md and "from: --target" not in md
    assert f"(from {source})" in md.split("<details", 1)[0]  # on the first screen


def test_the_summary_leads_with_the_oom_then_the_crossing_every_output_names_first(tmp_path):
    # issue 21: the summary led with the reserved curve and told the OOM last
    cap16 = H200_FULL.parent / "startup-cap16g"
    assert main(["issue", str(cap16), "-o", str(tmp_path / "b")]) == 0
    md = (tmp_path / "b" / "issue.md").read_text()
    first = md.split("\n\n")[1]
    assert first.startswith("**DIED: the process ran out of CUDA memory at 7.05 s in compile_or_warm_up/kernel_warmup")
    assert "Device used by this process first crossed" in md.split("<details", 1)[0]
