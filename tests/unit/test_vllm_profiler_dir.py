"""A folder as vLLM 0.34's profiler writes it (``--profiler-config '{"profiler": "torch", "torch_profiler_dir":
DIR, "torch_profiler_with_memory": true}'``: ``torch.profiler.tensorboard_trace_handler(DIR, worker_name=
"[prefix_]dp0_pp0_tp<i>_dcp0_ep0_rank<i>", use_gzip=True)`` per worker, ``<host>_<pid>.async_llm`` for the API
server; vllm/profiler/wrapper.py, vllm/v1/worker/gpu_worker.py) is read by ``memtrace report DIR``: one
rank per worker file, the rank taken from the name. Derived from real files: the H200's torch 2.14 Kineto
trace as rank 0 and (its pids changed) rank 1, the CPU MLP trace as the API server's."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from memtrace.analysis.memory.curves import all_curves
from memtrace.cli import main
from memtrace.importers.files import load_input
from memtrace.importers.kineto import rank_in_name

SNAPS = Path(__file__).resolve().parents[1] / "data" / "snapshots"
H214 = SNAPS / "h200-torch214" / "kineto.pt.trace.json.gz"
CPU = SNAPS / "cpu-mlp.pt.trace.json.gz"


@pytest.fixture
def vllm_dir(tmp_path):
    if not H214.exists() or not CPU.exists():
        pytest.skip("the Kineto traces are not shipped")
    d = tmp_path / "profiles"
    d.mkdir()
    shutil.copy(H214, d / "dp0_pp0_tp0_dcp0_ep0_rank0.1796386104000000000.pt.trace.json.gz")
    doc = json.load(gzip.open(H214, "rt"))
    for e in doc["traceEvents"]:
        if e.get("pid") == 1662:
            e["pid"] = 1663  # another worker process
    with gzip.open(d / "dp0_pp0_tp1_dcp0_ep0_rank1.1796386104000000001.pt.trace.json.gz", "wt") as f:
        json.dump(doc, f)
    shutil.copy(CPU, d / "vm_1660.async_llm.1796386104000000002.pt.trace.json.gz")
    return d, doc


def test_rank_comes_from_vllms_worker_name():
    assert rank_in_name("dp0_pp0_tp1_dcp0_ep0_rank1.1796386104000000001.pt.trace.json.gz") == 1
    assert rank_in_name("decode_dp0_pp0_tp0_dcp0_ep0_rank12.17963861.pt.trace.json") == 12
    assert rank_in_name("vm_1660.async_llm.1796386104000000002.pt.trace.json.gz") is None
    assert rank_in_name("kineto.pt.trace.json.gz") is None


def test_a_vllm_profiler_folder_is_one_run_of_its_workers(vllm_dir):
    d, doc = vllm_dir
    run = load_input(d)
    assert [(t.label, t.process.pid) for t in run.traces] == [
        ("rank 0", 1662), ("rank 1", 1663), ("host (CPU) of pid 1662", 1662), ("host (CPU) of pid 1663", 1663),
        ("host (CPU) of pid 8286", 8286),
    ]  # fmt: skip
    totals = [e["args"]["Total Allocated"] for e in doc["traceEvents"]
              if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1]  # fmt: skip
    for t in run.traces[:2]:
        alloc = all_curves(t).allocated
        assert alloc.peak_bytes == max(totals) == 541_793_792  # torch 2.14's allocated peak (README table)
        assert t.process.device_index == 0  # each worker's GPU is its cuda:0; the rank is the file's


def test_memtrace_report_reads_the_folder(vllm_dir, capsys):
    d, _ = vllm_dir
    assert main(["report", str(d)]) == 0
    out = capsys.readouterr().out
    assert "memtrace report: rank 0, pid 1662" in out and "memtrace report: rank 1, pid 1663" in out
    assert "Ranks side by side" in out


def test_a_profile_without_memory_events_is_one_line(tmp_path, capsys):
    d = tmp_path / "profiles"
    d.mkdir()
    doc = json.load(gzip.open(CPU, "rt"))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "[memory]"]
    with gzip.open(d / "dp0_pp0_tp0_dcp0_ep0_rank0.1.pt.trace.json.gz", "wt") as f:
        json.dump(doc, f)
    assert main(["report", str(d)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no [memory] events" in err[0] and "profile_memory=True" in err[0]


def test_two_profiling_sessions_in_one_folder_are_two_runs_each_file_named_once(vllm_dir, capsys):
    d, doc = vllm_dir
    (d / "vm_1660.async_llm.1796386104000000002.pt.trace.json.gz").unlink()
    (d / "dp0_pp0_tp1_dcp0_ep0_rank1.1796386104000000001.pt.trace.json.gz").unlink()
    doc["baseTimeNanoseconds"] += 60_000_000_000  # /start_profile again a minute later: the same rank, anew
    later = "dp0_pp0_tp0_dcp0_ep0_rank0.1796386164000000000.pt.trace.json.gz"
    with gzip.open(d / later, "wt") as f:
        json.dump(doc, f)
    assert main(["report", str(d)]) == 2
    # a slow machine adds progress lines ("memtrace: Loading profiles: done in 2.5 s"): the error is the one other
    (line,) = [x for x in capsys.readouterr().err.strip().splitlines() if ": done in " not in x]
    assert "holds two separate runs (rank 0 twice)" in line
    assert line.count(later) == 2  # once as the later run, once in the mv command (not once per trace in it)
