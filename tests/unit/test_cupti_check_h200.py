"""The H200 CUPTI check's own trace (tests/gpu/check_cupti.py, 2026-12-03, format with
``facts["cupti"]["started_us"]``): a raw ``cudaMalloc`` from a kernel library's stand-in appears with its
Python stack and phase, PyTorch's segment is recognised, and CUPTI's own device memory is named."""

from pathlib import Path

from memtrace.analysis.memory import non_torch
from memtrace.analysis.memory.curves import all_curves
from memtrace.analysis.memory.phases import path_at
from memtrace.model import MEMORY_OPS
from memtrace.store import load_trace
from references import summarize

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
    assert made[[i for i in range(len(r)) if r["bytes"][i] == 256 * MiB][0]]  # PyTorch's segment
    assert not made[raw].any()


def test_cuptis_own_memory_is_named_from_the_moment_it_was_enabled():
    t = load_trace(TRACE)
    fact = t.facts["cupti"]
    assert fact["on"] and isinstance(fact["started_us"], int)
    assert non_torch.cupti_own_bytes(t, all_curves(t)) == 12_582_912  # three 4 MiB steps inside activity_enable
    peak = next(b for b in summarize(t).non_torch_moments if b.moment == "peak")
    assert peak.cupti_bytes == 512 * MiB + 64 * MiB  # the raw cudaMalloc and CuPy's pool
    assert (peak.at_start_bytes, peak.cupti_own_bytes, peak.grew_unseen_bytes) == (552_402_944, 12_582_912, 0)
    assert peak.at_start_bytes + peak.cupti_own_bytes + peak.grew_unseen_bytes == peak.unexplained_bytes


def test_the_first_matmul_is_cublas_named_by_its_operator():
    """The first ``aten::mm`` makes cuBLAS allocate 1,024 + 131,072 + 67,108,864 B itself: the same three
    sizes (67,240,960 B) as the unnamed raw cudaMallocs of the vLLM start-up's profile_run
    (test_cupti_vllm_h200.py), recorded before operators were named."""
    t = load_trace(TRACE)
    ops = next(p for p in t.phases if p.name == "torch_ops")
    b = non_torch.breakdown(t, ops.end_us, "after the operators", curves=all_curves(t))
    cublas = b.category(non_torch.CUBLAS)
    assert (cublas.bytes, cublas.count) == (67_240_960, 3)
    assert sorted(a.bytes for a in cublas.largest) == [1024, 131_072, 64 * MiB]
    assert {a.op for a in cublas.largest} == {"aten::mm"}
    other = b.category(non_torch.OTHER)
    assert dict(other.libraries)["op aten::convolution"] == 25_348  # cuDNN's own, named by its operator
