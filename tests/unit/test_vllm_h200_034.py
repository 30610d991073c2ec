"""Real vLLM 0.34.0 start-ups on the H200 (tests/data/vllm-h200-034, issue 20), read back on this CPU machine.

vLLM 0.34.0 (installed with --no-deps beside FlashInfer 0.7.4, torch 2.14.0+cu130), the 8-layer Qwen3-MoE
of tests/data/vllm-h200 and a 32-layer Llama-shaped dense model, each with the extensible KV cache
(vLLM's default: the cache's pages committed through CUDA's VMM API after CUDA-graph capture) and
without it; the MoE model again on a "smaller card" (another process holding 96 GiB of the H200).
Every figure below is compared with what vLLM itself logged or what torch's own counters said in the
same worker; none is a figure memtrace computed and then wrote down.
"""

from __future__ import annotations

import re

import pytest
from memtrace import facts as F
from memtrace.analysis.analysed.run import analyse
from memtrace.analysis.capacity.extensible import extensible_sizing
from memtrace.analysis.capacity.fits import fit, fit_extensible, recorded
from memtrace.analysis.capacity.reconcile import reconcile_kv
from memtrace.analysis.memory import torch_counters, vmm
from memtrace.analysis.memory.curves import all_curves
from memtrace.store import load_run
from vllm034_data import logged, run_dir

GiB = 1 << 30
EXT = ("moe-ext", "dense-ext", "small-ext")
NOEXT = ("moe-noext", "dense-noext")


def _trace(step: str):
    return load_run(run_dir(step)).traces[0]


def _rank(trace):
    return analyse([trace]).worst


def _gib(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.parametrize("step", EXT + NOEXT)
def test_pytorchs_reserved_and_peaks_equal_torchs_own_counters_at_every_phase_edge(step):
    t = _trace(step)
    checks = torch_counters.counter_checks(t, all_curves(t))
    assert len(checks) >= 19  # two readings per phase: 0.34's phases, with or without the extensible cache
    assert [c for c in checks if not c.equal] == []
    assert t.facts[F.VLLM_VERSION] == t.facts["env"]["vllm"] == "0.34.0"


@pytest.mark.parametrize("step", EXT)
def test_the_kv_cache_committed_through_cuda_vmm_is_vllms_extended_kv_cache_to_the_block(step):
    t = _trace(step)
    blocks = int(logged(step, r"Extended KV cache to (\d+) blocks"))
    gib = _gib(logged(step, r"Extended KV cache to \d+ blocks \(([\d.]+) GiB\)"))
    s = vmm.summary(t)
    sizing = extensible_sizing(t)
    assert t.facts[F.VLLM_KV_BLOCKS] == blocks == sizing.num_blocks
    assert s.kv_cache_bytes == sizing.committed_final_bytes == sizing.pages_bytes
    assert round(s.kv_cache_bytes / GiB, 2) == gib
    assert s.failures == ()
    # address space is not memory: reserved for the cache's whole range, more than was committed
    assert s.reserved_bytes > s.kv_cache_bytes


@pytest.mark.parametrize("step", EXT)
def test_vllms_post_warm_up_sizing_is_rebuilt_term_by_term_and_gives_its_block_count(step):
    t = _trace(step)
    s = extensible_sizing(t)
    for term in ("free", "committed", "requested", "transient_peak", "torch_reserve_growth"):
        assert s.term(term).difference_bytes == 0, term
    assert s.num_blocks_from_inputs == s.num_blocks_memtrace == s.num_blocks
    # vLLM's "Memory after warmup: X GiB free, Y GiB committed to the KV cache, Z GiB kept for transient
    # activations (A GiB allocated at peak, B GiB of torch reservation growth); ... Torch may reserve up to C GiB."
    line = logged(step, r"(Memory after warmup: .*)")
    free, committed, kept, peak, growth = (float(x) for x in re.findall(r"([\d.]+) GiB", line)[:5])
    assert round(s.term("free").memtrace_bytes / GiB, 2) == free
    assert round(s.term("committed").memtrace_bytes / GiB, 2) == committed
    assert round(s.kept_for_transients_bytes / GiB, 2) == kept
    assert round(s.term("transient_peak").memtrace_bytes / GiB, 2) == peak
    assert round(s.term("torch_reserve_growth").memtrace_bytes / GiB, 2) == growth
    assert round(s.torch_limit_bytes / GiB, 2) == _gib(logged(step, r"Torch may reserve up to ([\d.]+) GiB"))


@pytest.mark.parametrize("step", EXT)
def test_nvmls_non_pytorch_band_does_not_count_the_kv_cache(step):
    t = _trace(step)
    c = all_curves(t)
    assert c.vmm.peak_bytes > 29 * GiB  # the KV cache, outside PyTorch
    assert c.reserved.peak_bytes < 18 * GiB  # PyTorch never saw it
    assert c.non_torch.peak_bytes < 5 * GiB  # CUDA context, NCCL, cuBLAS: not the KV cache
    assert c.held.peak_bytes == max(c.held.bytes) >= c.vmm.peak_bytes + 10 * GiB


@pytest.mark.parametrize("step", EXT + NOEXT)
def test_the_target_is_vllms_resolved_utilization_and_says_where_it_came_from(step):
    t = _trace(step)
    assert t.facts[F.UTIL_SOURCE] == "vllm-default"
    assert t.facts[F.UTIL] == (1.0 if step in EXT else 0.92)
    assert t.facts[F.VLLM_KV_SIZE_SOURCE] == ("extensible" if step in EXT else "profiling")


@pytest.mark.parametrize("step", NOEXT)
def test_without_the_extensible_cache_the_profiled_available_kv_is_reconstructed(step):
    t = _trace(step)
    r = reconcile_kv(t, all_curves(t))
    assert round(r.vllm_available_kv_bytes / GiB, 2) == _gib(logged(step, r"Available KV cache memory: ([\d.]+) GiB"))
    assert abs(r.difference_bytes) < 4096  # 1,884 B of 117-121 GiB on both models
    tokens = int(logged(step, r"GPU KV cache size: ([\d,]+) tokens").replace(",", ""))
    assert t.facts[F.VLLM_KV_TOKENS] == tokens


def test_fits_predicts_the_smaller_cards_kv_cache_to_the_block_from_the_full_cards_start_up():
    """small-ext: another process held 96 GiB of the H200 (holder.log) while vLLM started; fits, fed the
    full-card start-up and only what the other process held, says what vLLM then did."""
    full, small = _trace("moe-ext"), _trace("small-ext")
    others = all_curves(small).others.peak_bytes  # NVML: the holder's 96 GiB and its CUDA context
    assert others >= 96 * GiB
    r = _rank(full)
    f = fit_extensible(r.trace, full.process.device_total_bytes, None, recorded(r), others)
    assert f.survives
    assert f.kv_blocks == int(logged("small-ext", r"Extended KV cache to (\d+) blocks")) == 60704
    assert f.kv_tokens == int(logged("small-ext", r"GPU KV cache size: ([\d,]+) tokens").replace(",", ""))
    assert f.kv_cache_bytes == vmm.summary(small).kv_cache_bytes


def test_a_card_too_small_for_the_weights_dies_before_the_kv_cache_exists():
    full = _trace("moe-ext")
    r = _rank(full)
    f = fit(r.trace, 10 * GiB, rec=recorded(r))
    assert not f.survives and f.kv_blocks is None
    assert f.phase.startswith("load_model")


def test_the_report_shows_the_kv_cache_outside_pytorch_the_sizing_term_by_term_and_the_counters(capsys):
    from memtrace.cli import main

    assert main(["report", str(run_dir("moe-ext"))]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "from: the recorded --gpu-memory-utilization 1, vLLM's default with the extensible KV cache, sized after warm-up"
        in out
    )
    assert "vLLM committed 126.23 GiB (135,543,128,064 B) of KV cache pages through CUDA's virtual-memory API" in out
    assert "address space reserved for the cache's range: 128.45 GiB (not memory" in out
    assert "blocks: vLLM 258,528; vLLM's formula on vLLM's inputs 258,528; on memtrace's 258,528 (the same)" in out
    assert "kv_cache_extend committed 126.23 GiB (135,543,128,064 B) = the pages of those blocks" in out
    assert "equal torch's counters at all 25 readings" in out


def test_the_report_says_vllms_default_without_the_extensible_cache_and_has_no_vmm_section(capsys):
    from memtrace.cli import main

    assert main(["report", str(run_dir("moe-noext"))]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "from: the recorded --gpu-memory-utilization 0.92, vLLM's default with the KV cache sized by profiling" in out
    )
    assert "KV cache outside PyTorch" not in out and "sizing after warm-up" not in out
    assert "equal torch's counters at all 19 readings" in out


def test_fits_uses_vllms_post_warm_up_sizing_for_an_extensible_start_up(capsys):
    """On the recorded card fits gives back vLLM's own blocks; smaller cards get fewer, and one too small
    for what the start-up needs before the KV cache dies there; text and JSON say the same."""
    import json

    from memtrace.cli import main

    full = _trace("moe-ext")
    total = full.process.device_total_bytes
    assert main(["fits", str(run_dir("moe-ext")), "--capacity", f"{total},12GiB", "--json"]) == 1  # one card dies
    got = {f["capacity_bytes"]: f for f in json.loads(capsys.readouterr().out)["fits"]}
    on_card = got[total]
    assert on_card["kv_sizing"] == "extensible" and on_card["survives"]
    assert on_card["kv_blocks"] == 258528 and on_card["kv_tokens"] == 16545792
    assert on_card["kv_cache_bytes"] == vmm.summary(full).kv_cache_bytes
    small = got[12 * GiB]
    assert (small["verdict"], small["stage"], small["kv_blocks"]) == ("dies", "pre-KV", None)
    assert main(["fits", str(run_dir("moe-ext")), "--capacity", f"{total}"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "BOOTS: vLLM sizes the KV cache after warm-up to 126.23 GiB (258,528 blocks, 16,545,792 tokens)" in text


def test_diff_of_the_0251_start_up_against_0340_names_what_the_new_versions_moved(capsys):
    """The release gate across vLLM versions: vLLM 0.25.1 (tests/data/vllm-h200/startup, --gpu-memory-utilization
    0.92 set) against 0.34.0 (moe-ext, the same model and flags, utilization left to vLLM)."""
    from memtrace.cli import main
    from testdata import DATA, unpacked

    code = main(["diff", str(unpacked(DATA / "vllm-h200" / "startup")), str(run_dir("moe-ext"))])
    out = capsys.readouterr().out
    assert code == 1  # the KV cache grew 9.21 GiB with the whole card as target: over 2%
    assert "vllm 0.25.1 → 0.34.0" in out
    moved = out.split("What the new versions changed by themselves")[1].split("\n\n")[0]
    assert "gpu_memory_utilization: 0.92 → 1" in moved and "kv_cache_sizing: profiling → extensible" in moved
    assert "The KV cache moved: allocated through PyTorch's allocator → CUDA's VMM API (117.02 GiB → 126.23 GiB)" in out
    rows = {line.split("  ")[1].strip(): line for line in out.splitlines() if line.startswith("  ") and "→" in line}
    assert "117.02 GiB →  126.23 GiB" in rows["KV cache"]
    assert "137.35 GiB" in rows["peak held by this process"]  # reserved + the KV cache outside PyTorch
    assert "→   11.73 GiB" in rows["peak reserved"] and "not gated" in rows["peak reserved"]  # PyTorch's alone
    assert "gpu_memory_utilization" not in out.split("What the new versions")[0]  # not a set-up difference


def test_the_issue_bundle_says_where_the_kv_cache_went(tmp_path):
    from memtrace.cli import main

    assert main(["issue", str(run_dir("moe-ext")), "-o", str(tmp_path / "bundle")]) == 0
    text = (tmp_path / "bundle" / "issue.md").read_text()
    summary = text.split("<details", 1)[0]  # the first screen
    assert "KV cache: 126.23 GiB (258,528 blocks) committed through CUDA's VMM API after warm-up" in summary
    assert "vLLM's default with the extensible KV cache" in summary
    assert "## KV cache outside PyTorch (CUDA VMM)" in text


def test_a_flame_graph_at_a_time_names_that_time_once_and_holds_the_kv_cache_outside_pytorch(tmp_path):
    from memtrace.cli import main

    svg = tmp_path / "f.svg"
    assert main(["flame", str(run_dir("moe-ext")), "--at", "179.5", "-o", str(svg)]) == 0
    text = svg.read_text()
    assert "Live GPU memory at 179.500 s<" in text or "Live GPU memory at 179.500 s " in text
    assert "179.500 s: 179.500 s" not in text
    assert "[KV cache outside PyTorch (CUDA VMM)] · 126.23 GiB" in text


def test_the_default_flame_is_the_runs_peak_held_and_its_time_shows_the_same(tmp_path, capsys):
    """On 0.34 the process holds the most once the KV cache is committed outside PyTorch, after warm-up's reserved
    peak: the flame's default moment is that peak held, the run's headline decided once (issue 40 case 6; it was
    the reserved peak, 11.43 GiB, while the report's headline said 137.35 GiB), and --at its time shows the same."""
    from memtrace.cli import main

    held = all_curves(_trace("moe-ext")).held
    assert round(held.peak_bytes / GiB, 2) == 137.35
    assert main(["flame", str(run_dir("moe-ext")), "-o", str(tmp_path / "a.svg")]) == 0
    err = capsys.readouterr().err
    said = re.search(r"\(PyTorch 11.06 GiB \+ KV cache 126.23 GiB committed through CUDA VMM\) live at the peak held "
                     r"\(PyTorch reserved \+ the KV cache outside it\) \(([\d.]+) s\)", err)  # fmt: skip
    assert said and said[1] == "179.244" and "reserved peak" not in err
    assert main(["flame", str(run_dir("moe-ext")), "--at", said[1], "-o", str(tmp_path / "b.svg")]) == 0
    err = capsys.readouterr().err
    assert f"(PyTorch 11.06 GiB + KV cache 126.23 GiB committed through CUDA VMM) live at {said[1]} s\n" in err
