"""The CUPTI source on a real vLLM 0.25.1 start-up on the H200 (tests/gpu/cupti_round.sh, 2026-12-02):
1,745 records, PyTorch's segments recognised, the non-PyTorch rest broken down at the first crossing."""

from pathlib import Path

from memtrace.analysis import non_torch
from memtrace.analysis.summary import summarize
from memtrace.store import load_trace

TRACE = Path(__file__).parents[1] / "data" / "vllm-h200" / "startup-cupti" / "vm-pid1909-rank0.memtrace"


def test_records_stacks_and_pytorchs_segments():
    t = load_trace(TRACE)
    fact = t.facts["cupti"]
    assert (fact["records"], fact["records_with_stack"], fact["stacks"]) == (1745, 84, True)
    assert int(non_torch.torch_made(t).sum()) == 77
    assert any("drain watchdog off" in n.text for n in t.notes)


def test_breakdown_at_the_first_crossing_adds_up_to_nvml():
    first = next(b for b in summarize(load_trace(TRACE)).non_torch if b.moment == "first crossing")
    assert first.phase_path == "kv_cache_init"
    assert first.cupti_bytes == 68_362_212  # CUPTI saw 0.06 GiB of non-PyTorch device memory
    assert first.nvml_non_torch_bytes == 808_255_488
    assert first.unexplained_bytes == first.nvml_non_torch_bytes - first.cupti_bytes == 739_893_276
    assert first.torch_bytes > 128 * 2**30  # PyTorch's segments recognised, not counted as non-PyTorch
