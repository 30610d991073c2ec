"""The H200 CUPTI check's own trace (tests/gpu/check_cupti.py, 2026-12-03, format with
``facts["cupti"]["started_us"]``): a raw ``cudaMalloc`` from a kernel library's stand-in appears with its
Python stack and phase, PyTorch's segment is recognised, and CUPTI's own device memory is named."""

from pathlib import Path

from memtrace.analysis import non_torch
from memtrace.analysis.phases import path_at
from memtrace.analysis.summary import summarize
from memtrace.model import MEMORY_OPS
from memtrace.store import load_trace

TRACE = Path(__file__).parents[1] / "data" / "vllm-h200" / "check-cupti" / "check-cupti.memtrace"
MiB = 1 << 20


def test_a_raw_cudamalloc_has_its_python_stack_and_phase():
    t = load_trace(TRACE)
    r = t.device_allocs
    alloc, release = MEMORY_OPS.index("allocation"), MEMORY_OPS.index("release")
    raw = [i for i in range(len(r)) if r["bytes"][i] == 512 * MiB]
    assert [int(r["op"][i]) for i in raw] == [alloc, release]
    inner = t.stack_frames(int(r["stack"][raw[0]]))[0]
    assert (inner.filename.rsplit("/", 1)[-1], inner.line, inner.name) == ("check_cupti.py", 72, "raw_cudamalloc")
    assert path_at(t, int(r["time_us"][raw[0]])) == "raw_cudamalloc"
    made = non_torch.torch_made(t)
    assert [int(r["bytes"][i]) for i in range(len(r)) if made[i]] == [256 * MiB]  # PyTorch's segment


def test_cuptis_own_memory_is_named_from_the_moment_it_was_enabled():
    t = load_trace(TRACE)
    fact = t.facts["cupti"]
    assert fact["on"] and isinstance(fact["started_us"], int)
    assert non_torch.cupti_own_bytes(t) == 12_582_912  # three 4 MiB steps inside activity_enable
    peak = next(b for b in summarize(t).non_torch if b.moment == "peak")
    assert peak.cupti_bytes == 512 * MiB + 64 * MiB  # the raw cudaMalloc and CuPy's pool
    assert (peak.at_start_bytes, peak.cupti_own_bytes, peak.grew_unseen_bytes) == (552_402_944, 12_582_912, 0)
    assert peak.at_start_bytes + peak.cupti_own_bytes + peak.grew_unseen_bytes == peak.unexplained_bytes
