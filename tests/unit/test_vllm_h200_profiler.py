"""vLLM 0.34.0's own torch profiler on the H200, recorded for real (tests/data/snapshots/vllm-h200-profiler):
``vllm serve`` (8-layer Qwen3-MoE, dummy weights, eager) with ``--profiler-config '{"profiler": "torch",
"torch_profiler_dir": DIR, "torch_profiler_with_memory": true}'``, ``/start_profile``, one completion (64 prompt
tokens, 2 out), ``/stop_profile``. The GPU worker's trace (rank 0) holds 564 CUDA memory events and 4 of the CPU;
11.03 GiB were allocated before the profiler started. Every figure is the trace's own: its 'Total Allocated' and
'Total Reserved' after each memory event."""

from __future__ import annotations

import json
import lzma
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from memtrace.analysis.holders.flame import BEFORE_RECORDING
from memtrace.analysis.memory import quantities as Q
from memtrace.analysis.memory.curves import all_curves
from memtrace.cli import main
from memtrace.importers.files import load_input
from memtrace.units import GiB

DATA = Path(__file__).resolve().parents[1] / "data"
FOLDER = DATA / "snapshots" / "vllm-h200-profiler"
WORKER = FOLDER / "dp0_pp0_tp0_dcp0_ep0_rank0.1796492118355142002.pt.trace.json.xz"
#: vLLM 0.32's API server trace of tests/data/vllm-cpu-profiler (no memory events), the same name and format as
#: 0.34's (that folder's README): the H200's was not shipped, being this same case
API_SERVER = DATA / "vllm-cpu-profiler" / "tp1" / "vm_15005.async_llm.1796418706581720240.pt.trace.json.xz"
BEFORE_ALLOCATED, BEFORE_RESERVED = 11_842_613_248, 11_880_366_080


def need(path: Path) -> Path:
    assert path.exists(), f"{path} is not in the checkout (tests/data/snapshots ships it)"
    return path


@pytest.fixture(scope="module")
def memory():
    """The CUDA [memory] events of the worker's trace, in the profiler's order."""
    with lzma.open(need(WORKER), "rt") as f:
        doc = json.load(f)
    mem = [e for e in doc["traceEvents"] if e.get("name") == "[memory]" and e["args"]["Device Type"] == 1]
    return sorted(mem, key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)))


@pytest.fixture(scope="module")
def rank0():
    gpu, host = load_input(need(FOLDER)).traces
    assert (host.label, host.process.device_index) == ("host (CPU) of pid 5769", None)
    return gpu


@pytest.fixture
def with_api_server(tmp_path):
    """The folder as vLLM writes it: the worker's trace beside an API server's without memory events."""
    d = tmp_path / "profiles"
    d.mkdir()
    shutil.copy(WORKER, d)
    shutil.copy(need(API_SERVER), d)
    return d


def test_curves_equal_the_traces_totals_after_every_memory_event(rank0, memory):
    assert (rank0.label, rank0.process.device_index, rank0.process.pid) == ("rank 0", 0, 5769)
    assert len(memory) == 564
    curves = all_curves(rank0)
    at = np.flatnonzero(np.isin(rank0.events["action"], (0, 2))) + 1  # the curves' index after each alloc / free
    assert np.array_equal(curves.allocated.bytes[at], [e["args"]["Total Allocated"] for e in memory])
    assert np.array_equal(curves.reserved.bytes[at], [e["args"]["Total Reserved"] for e in memory])
    assert (curves.allocated.peak_bytes, curves.reserved.peak_bytes) == (11_845_180_416, 11_882_463_232)


def test_each_allocation_is_named_by_the_operator_that_made_it(rank0):
    """The profiler's ranges around a memory event are its stack: every allocation lies inside an operator (its
    innermost frame); most frees come after the operator returned, inside vLLM's Python functions."""
    ev = rank0.events
    allocs = [rank0.stack_frames(int(s)) for s in ev["stack"][ev["action"] == 0]]
    assert len(allocs) == 282 and all(frames[0].filename == "<op>" for frames in allocs)
    assert {f[0].name for f in allocs} >= {"aten::empty", "aten::mm", "aten::empty_strided"}
    assert {"execute_model", "forward"} <= {f.name for f in rank0.frames}  # vLLM's Python frames around them


def test_memory_held_before_profiling_is_the_first_events_totals_said_as_such(rank0, memory, capsys):
    first = memory[0]["args"]
    assert BEFORE_ALLOCATED == first["Total Allocated"] - first["Bytes"]
    assert BEFORE_RESERVED == first["Total Reserved"]
    b = Q.before_recording(rank0, all_curves(rank0))
    assert (b.allocated_bytes, b.reserved_bytes, b.exact, b.how) == (BEFORE_ALLOCATED, BEFORE_RESERVED, True,
                                                                     Q.FROM_TOTALS)  # fmt: skip
    assert main(["report", "--json", str(FOLDER)]) == 0
    doc = json.loads(capsys.readouterr().out)["traces"][0]["before_recording"]
    assert (doc["allocated_bytes"], doc["reserved_bytes"], doc["how"]) == (BEFORE_ALLOCATED, BEFORE_RESERVED,
                                                                           Q.FROM_TOTALS)  # fmt: skip


def test_the_report_warns_once_and_claims_nothing_about_memtraces_own_cost(with_api_server, capsys):
    assert main(["report", str(with_api_server)]) == 0
    captured = capsys.readouterr()
    (warning,) = captured.err.strip().splitlines()
    assert warning.startswith(f"memtrace: warning: {with_api_server}: not read: {API_SERVER.name} (no [memory]")
    assert "not read" not in captured.out
    assert "memtrace on the program's threads" not in captured.out and "predates" not in captured.out
    assert main(["report", "--json", str(with_api_server)]) == 0
    traces = json.loads(capsys.readouterr().out)["traces"]
    assert [t["self_cost_line"] for t in traces] == [None, None]  # memtrace never ran in vLLM's processes


def test_top_holders_at_the_peak_start_with_what_was_held_before_profiling(capsys):
    assert main(["report", str(FOLDER)]) == 0
    out = capsys.readouterr().out
    holders = out.split("Top holders at the reserved peak (0.17 s), by allocating site")[1].split("\n\n")[0]
    first = holders.splitlines()[3].split()
    assert first[:3] == ["11.03", "100.0%", "-"] and " ".join(first[4:]) == f"({Q.BEFORE_RECORDING.label})"
    # what the profiled step allocated, after it: 1.57 MiB, in the column's unit (GiB) never a bare zero
    assert re.search(r"<0\.01 +0\.0% +9 +9 +<op>:0 aten::empty", holders)


def test_the_flame_graph_holds_every_byte_allocated_at_the_peak(rank0, tmp_path):
    assert main(["flame", str(FOLDER), "-f", "folded", "-o", str(tmp_path / "f.folded")]) == 0
    rows = [ln.rsplit(" ", 1) for ln in (tmp_path / "f.folded").read_text().splitlines()]
    curves = all_curves(rank0)
    fullest = curves.allocated.bytes[Q.fullest_at_peak(curves.allocated, curves.reserved)]
    assert sum(int(n) for _, n in rows) == fullest == 11_845_180_416
    before = sum(int(n) for path, n in rows if path.startswith(BEFORE_RECORDING))
    assert before == BEFORE_ALLOCATED  # no block from before profiling was freed while it ran


def test_fits_counts_the_memory_held_before_profiling(capsys):
    assert main(["fits", str(FOLDER), "--capacity", "16GiB,8GiB"]) == 1
    captured = capsys.readouterr()
    assert "8.00 GiB  OOM outside any phase" in captured.out and "16.00 GiB  fits" in captured.out
    assert "host (CPU)" not in captured.out  # the CPU's trace is no card's memory
    assert (
        captured.err.strip() == "memtrace: not predicted: host (CPU) of pid 5769 (not a GPU's memory: no card holds it)"
    )


def test_fits_answers_for_the_profiled_window_alone_never_for_the_program(capsys):
    # the window began mid-serving: its 11.07 GiB held (weights and a KV cache sized for the H200) says nothing
    # of the start-up's peak, so fits never calls it "this program" nor "its whole recording (no KV cache)"
    assert main(["fits", str(FOLDER), "--capacity", "16GiB"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"The input is {Q.PROFILED_WINDOW}." in text
    assert "FITS in the profiled window: what was held in it fits, 4.93 GiB to spare at its peak" in text
    assert "it held 11.07 GiB at the window's peak" in text
    assert "Smallest card that window fits on: about 11.10 GiB" in text
    assert "this program" not in text and "no KV cache" not in text
    assert main(["fits", str(FOLDER), "--capacity", "16GiB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["profiled_window"] is True


def test_the_issue_bundle_names_torch_profiler_and_the_traces_own_environment(tmp_path):
    assert main(["issue", str(FOLDER), "-o", str(tmp_path / "b")]) == 0
    md = (tmp_path / "b" / "issue.md").read_text()
    env = md.split("## Environment")[1].split("\n## ")[0]
    assert "| recorded by | torch.profiler with profile_memory=True" in env and "_dump_snapshot" not in env
    assert "| GPU (the trace's header) | NVIDIA H200 (139.80 GiB) |" in env
    assert "| vLLM (the trace's header) | 0.34.0 |" in env
    assert "Recorded with memtrace" not in md
    assert f"`({Q.BEFORE_RECORDING.label})`" in md.split("**Who held it**")[1].split("\n")[0]
    assert 11 * GiB < BEFORE_ALLOCATED < 12 * GiB
