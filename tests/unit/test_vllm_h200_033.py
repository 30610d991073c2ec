"""A real vLLM 0.33.0 start-up on the H200 (tests/data/vllm-h200-033), read back on this CPU machine.

vLLM 0.33.0 (with FlashInfer 0.7.2.post1, torch 2.14.0+cu130), the 8-layer Qwen3-MoE of tests/data/vllm-h200,
vLLM's defaults: 0.33 has no extensible KV cache, so the cache is sized by profiling and
--gpu-memory-utilization, left unset, is 0.92. Every figure below is compared with what vLLM itself
logged (or recorded in the worker) or with torch's own counters in the same worker; none is a figure
memtrace computed and then wrote down.
"""

from __future__ import annotations

import re

import pytest
from memtrace import facts as F
from memtrace.analysis.capacity.reconcile import FORMULA_033, reconcile_kv
from memtrace.analysis.memory import torch_counters, vmm
from memtrace.analysis.memory.curves import all_curves
from memtrace.store import load_run
from vllm034_data import VLLM033

GiB = 1 << 30
STEPS = ("moe",)


def _trace(step: str):
    return load_run(VLLM033.run_dir(step)).traces[0]


def _number(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.parametrize("step", STEPS)
def test_the_trace_is_vllm_0330_with_flashinfer_and_torch_it_pins(step):
    t = _trace(step)
    env = t.facts[F.ENV]
    assert t.facts[F.VLLM_VERSION] == env["vllm"] == "0.33.0"
    assert f"(v{env['vllm']})" in VLLM033.logged(step, r"(Initializing a V1 LLM engine \(v[\d.]+\))")
    assert env["flashinfer"] == "0.7.2.post1" and env["torch"].startswith("2.14.0")
    assert env["vllm_requires"] == {"flashinfer-python": "==0.7.2.post1", "torch": "==2.14.0"}


@pytest.mark.parametrize("step", STEPS)
def test_pytorchs_reserved_and_peaks_equal_torchs_own_counters_at_every_phase_edge(step):
    t = _trace(step)
    checks = torch_counters.counter_checks(t, all_curves(t))
    assert len(checks) == 19  # two readings per phase edge of 0.33's start-up, as on 0.34 without the extensible cache
    assert [c for c in checks if not c.equal] == []


@pytest.mark.parametrize("step", STEPS)
def test_the_target_is_vllms_default_092_and_says_where_it_came_from(step):
    t = _trace(step)
    assert "--gpu-memory-utilization" not in t.facts[F.ENV]["cmdline"]  # left to vLLM
    assert t.facts[F.UTIL] == 0.92
    assert t.facts[F.UTIL_SOURCE] == "vllm-default"
    assert t.facts[F.VLLM_KV_SIZE_SOURCE] == "profiling"
    # vLLM: "Desired GPU memory utilization is (0.92, 128.62 GiB)"
    util, gib = VLLM033.logged(step, r"Desired GPU memory utilization is \(([\d.]+, [\d.]+) GiB\)").split(", ")
    assert float(util) == t.facts[F.UTIL]
    assert round(t.facts[F.TARGET_BYTES] / GiB, 2) == float(gib)
    assert vmm.summary(t) is None  # no extensible KV cache in 0.33: nothing committed through CUDA's VMM API


@pytest.mark.parametrize("step", STEPS)
def test_the_profiled_available_kv_is_reconstructed_within_bytes_of_vllms(step):
    t = _trace(step)
    r = reconcile_kv(t, all_curves(t))
    assert r.formula == FORMULA_033 and r.source == "nvml"
    assert round(r.vllm_available_kv_bytes / GiB, 2) == _number(
        VLLM033.logged(step, r"Available KV cache memory: ([\d.]+) GiB")
    )
    # 125,824,361,923 B (memtrace) against vLLM's 125,824,360,039 B on moe: 1,884 B apart
    assert 0 <= r.difference_bytes < 4096


@pytest.mark.parametrize("step", STEPS)
def test_vllms_kv_tokens_and_blocks_facts_match_its_log(step):
    t = _trace(step)
    tokens = int(_number(VLLM033.logged(step, r"GPU KV cache size: ([\d,]+) tokens")))
    assert t.facts[F.VLLM_KV_TOKENS] == tokens
    block_size = t.facts[F.VLLM_CONFIG]["block_size"]
    assert t.facts[F.VLLM_KV_BLOCKS] * block_size == tokens
    # the blocks' tensors fit in what vLLM said was available, with less than a block per layer to spare
    kv_bytes, available = t.facts[F.VLLM_KV_BYTES], t.facts[F.VLLM_AVAILABLE_KV_BYTES]
    per_block = kv_bytes // t.facts[F.VLLM_KV_BLOCKS]
    assert kv_bytes == per_block * t.facts[F.VLLM_KV_BLOCKS]
    assert 0 <= available - kv_bytes < per_block


def test_the_report_exits_0_and_says_vllms_default_and_the_counters(capsys):
    from memtrace.cli import main

    assert main(["report", str(VLLM033.run_dir("moe"))]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "vllm 0.33.0, flashinfer 0.7.2.post1" in out
    assert (
        "from: the recorded --gpu-memory-utilization 0.92, vLLM's default with the KV cache sized by profiling" in out
    )
    assert "vLLM reported 117.18 GiB; memtrace's reconstruction differs by +1.84 KiB" in out  # 1,884 B
    assert "equal torch's counters at all 19 readings" in out
    assert "KV cache outside PyTorch" not in out
    m = re.search(r"Target ([\d.]+) GiB", out)
    assert m and m.group(1) == "128.62"
