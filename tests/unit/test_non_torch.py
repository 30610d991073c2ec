"""``analysis.non_torch`` and the report's section, over a real H200 start-up trace given CUPTI records.

The trace (tests/data/h200/startup-full, no CUPTI records: recorded before format 1.2) gets device
allocation records built here the way ``capture.cupti`` writes them: one of PyTorch's own segments
(same address and size as a ``segment_alloc`` event), and allocations from NCCL, FlashInfer's JIT, a
matmul, CuPy, one during CUDA-graph capture, one without a stack, one released before the moment and
pinned host memory. The figures are checked to the byte.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
from memtrace.analysis.analysed.landmarks import steady_non_torch_at
from memtrace.analysis.analysed.summary import summary_doc
from memtrace.analysis.memory import non_torch as nt
from memtrace.analysis.memory.curves import all_curves
from memtrace.model import ACTION_CODE, FORMAT_VERSION, MEMORY_KINDS, MEMORY_OPS, Frame, Segment, empty_device_allocs
from memtrace.plots.text import render_report
from memtrace.store import load_trace, save_trace
from references import summarize

from tests.testdata import DATA, real_traces

MiB = 1 << 20
SITE = "/usr/local/lib/python3.12/site-packages/"
DEVICE, PINNED = MEMORY_KINDS.index("device"), MEMORY_KINDS.index("pinned")
ALLOC, RELEASE = MEMORY_OPS.index("allocation"), MEMORY_OPS.index("release")


@pytest.fixture(scope="module")
def real():
    return load_trace(DATA / "h200" / "startup-full" / "vm-pid457.memtrace")


def _stack(trace, frames: list[tuple[str, int, str]]) -> int:
    ids = []
    for f in frames:
        trace.frames.append(Frame(*f))
        ids.append(len(trace.frames) - 1)
    trace.stacks.append(tuple(ids))
    return len(trace.stacks) - 1


def with_records(real):
    """``real`` plus CUPTI records; returns (trace, peak time, the expected bytes per category)."""
    t = dataclasses.replace(real, frames=list(real.frames), stacks=list(real.stacks))
    peak = summarize(real).peak_device_used.time_us
    capture = next(p for p in t.phases if p.name == "capture_model")
    seg = real.events[real.events["action"] == ACTION_CODE["segment_alloc"]][0]
    s0 = int(real.events["time_us"][0])
    nccl = _stack(t, [(SITE + "vllm/distributed/device_communicators/pynccl.py", 90, "__init__")])
    jit = _stack(t, [(SITE + "flashinfer/jit/core.py", 120, "build_and_load")])
    mm = _stack(t, [(SITE + "vllm/model_executor/layers/linear.py", 200, "linear")])
    cupy = _stack(t, [(SITE + "cupy/_creation/basic.py", 22, "empty"), ("/app/run.py", 5, "main")])
    graph = _stack(t, [("/app/kernels.py", 10, "workspace")])
    rows = [  # time, address, bytes, kind, op, stack
        (int(seg["time_us"]), int(seg["addr"]), int(seg["size"]), DEVICE, ALLOC, -1),  # PyTorch's own
        (s0 + 1, 0x7000_0000_0000, 512 * MiB, DEVICE, ALLOC, nccl),
        (s0 + 2, 0x7001_0000_0000, 100 * MiB, MEMORY_KINDS.index("device_static"), ALLOC, jit),
        (s0 + 3, 0x7002_0000_0000, 8 * MiB, DEVICE, ALLOC, mm),
        (s0 + 4, 0x7003_0000_0000, 64 * MiB, DEVICE, ALLOC, cupy),
        (s0 + 5, 0x7004_0000_0000, 30 * MiB, DEVICE, ALLOC, -1),
        (s0 + 6, 0x7005_0000_0000, 200 * MiB, DEVICE, ALLOC, cupy),
        (s0 + 7, 0x7005_0000_0000, 200 * MiB, DEVICE, RELEASE, -1),  # released before the peak
        (s0 + 8, 0x7006_0000_0000, 1024 * MiB, PINNED, ALLOC, cupy),  # host memory
        (capture.start_us + 1, 0x7007_0000_0000, 16 * MiB, DEVICE, ALLOC, graph),
        (peak + 10, 0x7008_0000_0000, 128 * MiB, DEVICE, ALLOC, cupy),  # after the peak
    ]
    recs = empty_device_allocs(len(rows))
    for i, (time_us, addr, size, kind, op, stack) in enumerate(rows):
        recs[i] = (time_us, addr, size, kind, op, stack, 457, 0, i)
    t.device_allocs = recs
    expected = {nt.NCCL: 512 * MiB, nt.JIT: 100 * MiB, nt.CUBLAS: 8 * MiB, nt.OTHER: 94 * MiB, nt.GRAPHS: 16 * MiB}
    return t, peak, expected, int(seg["size"])


def test_the_breakdown_at_the_peak_to_the_byte(real):
    t, peak, expected, seg_bytes = with_records(real)
    b = nt.breakdown(t, peak, "peak", curves=all_curves(t))
    got = {c.name: c.bytes for c in b.categories if c.name != nt.UNEXPLAINED}
    assert got == expected
    assert b.torch_bytes == seg_bytes  # recognised, not counted as non-PyTorch
    assert b.cupti_bytes == sum(expected.values())
    nvml = steady_non_torch_at(all_curves(t), peak)
    assert b.nvml_non_torch_bytes == nvml and b.unexplained_bytes == nvml - b.cupti_bytes
    assert b.categories[-1].name == nt.UNEXPLAINED and b.categories[0].name == nt.NCCL
    assert b.category(nt.OTHER).libraries == (("cupy", 64 * MiB), ("no stack", 30 * MiB))
    assert b.category(nt.NCCL).largest[0].frame.name == "__init__"
    assert b.phase_path == "compile_or_warm_up/capture_model"


def test_pytorch_segments_are_paired_once_per_event():
    t = dataclasses.replace(load_trace(DATA / "h200" / "startup-full" / "vm-pid457.memtrace"))
    seg = t.events[t.events["action"] == ACTION_CODE["segment_alloc"]][0]
    recs = empty_device_allocs(3)
    addr, size = int(seg["addr"]), int(seg["size"])
    recs[0] = (1, addr, size, DEVICE, ALLOC, -1, 1, 0, 1)
    recs[1] = (2, addr, size, DEVICE, RELEASE, -1, 1, 0, 2)
    recs[2] = (3, addr, size, DEVICE, ALLOC, -1, 1, 0, 3)  # the same range again, by someone else
    t.device_allocs = recs
    n_events = int(((t.events["addr"] == addr) & (t.events["size"] == size) & (t.events["action"] == 3)).sum())
    assert n_events == 1  # one segment_alloc (the final snapshot's segment is the same one, not another)
    assert nt.torch_made(t).tolist() == [True, True, False]  # its release is PyTorch's too
    # a segment of the final snapshot that no event made (it existed before recording) is PyTorch's too
    t.segments = [*t.segments, Segment(address=0x5000_0000_0000, total_bytes=2 * MiB)]
    recs = recs.copy()  # the analysed columns are read-only (memo): a new one
    recs[2] = (3, 0x5000_0000_0000, 2 * MiB, DEVICE, ALLOC, -1, 1, 0, 3)
    t.device_allocs = recs
    assert nt.torch_made(t).tolist() == [True, True, True]


def test_summary_report_and_file_format_carry_the_breakdown(real, tmp_path):
    t, peak, expected, _ = with_records(real)
    back = load_trace(save_trace(t, tmp_path / "cupti.memtrace"))
    assert np.array_equal(back.device_allocs, t.device_allocs) and FORMAT_VERSION >= (1, 2)
    s = summarize(back)
    assert [b.moment for b in s.non_torch_moments] == ["first crossing", "peak"]
    first = s.non_torch_moments[0]
    assert first.time_us == s.crossing_list[0].time_us and first.category(nt.GRAPHS) is None  # before capture
    assert s.non_torch_moments[1].cupti_bytes == sum(expected.values())
    out = io.StringIO()
    render_report(s, out, width=140)
    text = out.getvalue()
    assert "Non-PyTorch memory by category (CUPTI" in text
    for name in (nt.NCCL, nt.JIT, nt.CUBLAS, nt.GRAPHS, nt.UNEXPLAINED, "cupy 0.06"):
        assert name in text, name
    assert "vllm/distributed/device_communicators/pynccl.py:90 __init__" in text
    assert "unexplained is negative" in text  # at the first crossing: the records here outweigh NVML's figure
    plain = summary_doc(s)["non_torch"][1]  # report --json
    assert plain["cupti_bytes"] == sum(expected.values()) and plain["categories"][0]["name"] == nt.NCCL


def test_without_records_nothing_changes_and_old_files_load_empty(real):
    s = summarize(real)
    assert s.non_torch_moments == [] and nt.breakdown(real, 0, "peak", curves=all_curves(real)) is None
    out = io.StringIO()
    render_report(s, out)
    assert "CUPTI" not in out.getvalue()
    for path in real_traces()[:6]:  # every shipped trace predates format 1.2
        assert load_trace(path).device_allocs.dtype == empty_device_allocs().dtype
        assert len(load_trace(path).device_allocs) == 0


@pytest.mark.parametrize(
    ("frames", "phase", "category"),
    [
        ([("/x/site-packages/torch/distributed/distributed_c10d.py", 1, "barrier")], "", nt.NCCL),
        ([("/x/site-packages/flashinfer/gemm.py", 1, "run")], "capture_model", nt.JIT),
        ([("/app/a.py", 1, "f")], "compile_or_warm_up/capture_model", nt.GRAPHS),
        ([("/x/site-packages/torch/cuda/graphs.py", 1, "capture_begin")], "", nt.GRAPHS),
        ([("/x/site-packages/torch/nn/functional.py", 1, "linear")], "", nt.CUBLAS),
        ([("/x/site-packages/triton/compiler.py", 1, "load")], "", nt.OTHER),
        ([], "", nt.OTHER),
    ],
)
def test_classify(frames, phase, category):
    assert nt.classify([Frame(*f) for f in frames], phase)[0] == category
