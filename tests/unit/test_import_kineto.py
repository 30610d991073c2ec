"""torch.profiler / Kineto traces (``.pt.trace.json[.gz]`` with ``[memory]`` events) read as traces: checked
against the trace's own totals at every memory event. ``cpu-mlp.pt.trace.json.gz`` was recorded here with
torch 2.13 CPU (tests/data/snapshots/recipes/record_cpu_kineto.py): its events are the CPU's (host memory)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from memtrace.analysis.memory.curves import all_curves
from memtrace.cli import main
from memtrace.errors import TraceFormatError
from memtrace.importers.kineto import traces_from_kineto, traces_from_kineto_file
from memtrace.store import load_trace

SNAPS = Path(__file__).resolve().parents[1] / "data" / "snapshots"
CPU_MLP = SNAPS / "cpu-mlp.pt.trace.json.gz"
GPU_DIR = Path(__file__).resolve().parents[1] / "data" / "snapshots" / "h200-torch214"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path.name} is not shipped")
    return path


def _memory_events(doc, device_type):
    mem = [e for e in doc["traceEvents"] if e.get("name") == "[memory]" and e["args"]["Device Type"] == device_type]
    return sorted(mem, key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)))


def _doc(path: Path):
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        return json.load(f)


def _check_totals(trace, mem):
    """memtrace's curves after each memory event equal the trace's Total Allocated / Total Reserved."""
    curves = all_curves(trace)
    ev = trace.events["action"]
    at = np.flatnonzero(np.isin(ev, (0, 2))) + 1  # the curves' index after each alloc / free_completed
    assert len(at) == len(mem)
    allocated = np.array([e["args"]["Total Allocated"] for e in mem])
    reserved = np.array([e["args"]["Total Reserved"] for e in mem])
    assert np.array_equal(curves.allocated.bytes[at], allocated)
    return curves, reserved


def test_cpu_profile_allocated_equals_the_traces_total_allocated_at_every_memory_event():
    doc = _doc(need(CPU_MLP))
    mem = _memory_events(doc, 0)
    (trace,) = traces_from_kineto_file(CPU_MLP)
    assert trace.label == "host (CPU) of pid 8286" and trace.process.device_index is None
    curves, _ = _check_totals(trace, mem)
    assert curves.allocated.peak_bytes == max(e["args"]["Total Allocated"] for e in mem) == 2_888_200
    assert len(mem) == 88


def test_stacks_are_the_enclosing_ops_and_python_functions_and_phases_the_memtrace_ranges():
    (trace,) = traces_from_kineto_file(need(CPU_MLP))
    names = {f.name for f in trace.frames}
    assert {"aten::addmm", "aten::linear", "forward"} <= names
    i = next(i for i in range(len(trace.events)) if trace.stack_frames(int(trace.events["stack"][i])))
    frames = trace.stack_frames(int(trace.events["stack"][i]))
    assert frames[0].filename == "<op>"  # innermost first: an operator, then the Python frames around it
    assert any(f.filename.endswith("record_cpu_kineto.py") for f in frames)
    assert [p.name for p in trace.phases] == ["forward", "backward", "step"] * 2
    base_us = _doc(CPU_MLP)["baseTimeNanoseconds"] // 1000  # the profiler's times moved to the Unix epoch
    assert base_us < trace.recording.start_us <= trace.phases[0].start_us


def test_report_and_import_of_a_profiler_trace(tmp_path, monkeypatch, capsys):
    src = need(CPU_MLP)
    before = src.read_bytes()
    assert main(["report", str(src)]) == 0
    out = capsys.readouterr().out
    assert "host (CPU)" in out and "torch-profiler" in out and "forward" in out
    assert "<op>:0 aten::mm" in out  # the top holder at the peak is named by its operator
    monkeypatch.chdir(tmp_path)
    assert main(["import", str(src)]) == 0
    t = load_trace(tmp_path / "cpu-mlp.memtrace")
    assert t.label == "host (CPU) of pid 8286" and np.array_equal(t.events, traces_from_kineto_file(src)[0].events)
    assert src.read_bytes() == before


def _cuda_variant():
    """The CPU trace's events moved to cuda:0 and cuda:1 in memory, with Total Reserved growing in 2 MiB
    segments (derived: what a CUDA trace's [memory] events look like, on real addresses, sizes and times)."""
    doc = _doc(need(CPU_MLP))
    for dev in (0, 1):
        reserved = 0
        for e in _memory_events(doc, 0):
            a = dict(e["args"], **{"Device Type": 1, "Device Id": dev})
            while reserved < a["Total Allocated"]:
                reserved += 2 << 20
            a["Total Reserved"] = reserved
            doc["traceEvents"].append(dict(e, args=a))
    return doc


def test_every_cuda_device_is_a_rank_and_reserved_follows_total_reserved():
    doc = _cuda_variant()
    traces = traces_from_kineto(doc, source="variant")
    assert [t.label for t in traces] == ["rank 0", "rank 1", "host (CPU) of pid 8286"]
    for t in traces[:2]:
        mem = [e for e in _memory_events(doc, 1) if e["args"]["Device Id"] == t.process.device_index]
        curves, reserved = _check_totals(t, mem)
        at = np.flatnonzero(np.isin(t.events["action"], (0, 2))) + 1
        assert np.array_equal(curves.reserved.bytes[at], reserved)
        assert curves.baseline.consistent and curves.reserved.peak_bytes == 4 << 20
    (only,) = traces_from_kineto(doc, source="variant", device=1)
    assert only.process.device_index == 1
    with pytest.raises(TraceFormatError, match=r"no memory events for cuda:3 \(CUDA devices in it: 0, 1\)"):
        traces_from_kineto(doc, source="variant", device=3)


def test_files_that_are_not_memory_profiles_are_refused_in_one_line(tmp_path, capsys):
    timeline = tmp_path / "timeline.json"
    timeline.write_text(json.dumps([[1, 2], [[0, 0], [1, 1]]]))
    no_memory = tmp_path / "ops.pt.trace.json"
    no_memory.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2}]}))
    broken = tmp_path / "broken.json.gz"
    broken.write_bytes(b"\x1f\x8b not gzip")
    for path, words in (
        (timeline, "export_memory_timeline() output"),
        (no_memory, "profile_memory=True"),
        (broken, "not a readable JSON trace"),
    ):
        assert main(["report", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert words in err[-1] and "Traceback" not in "\n".join(err)


def test_h200_kineto_trace_matches_its_own_totals():
    paths = sorted(GPU_DIR.rglob("*.pt.trace.json*"))
    assert paths, "the H200 Kineto trace is shipped under tests/data/snapshots/h200-torch214"
    for path in paths:
        doc = _doc(path)
        for t in traces_from_kineto(doc, source=str(path)):
            if t.process.device_index is None:
                continue
            mem = [e for e in _memory_events(doc, 1) if e["args"]["Device Id"] == t.process.device_index]
            curves, reserved = _check_totals(t, mem)
            at = np.flatnonzero(np.isin(t.events["action"], (0, 2))) + 1
            assert np.array_equal(curves.reserved.bytes[at], reserved)


def test_the_cpus_memory_is_never_exported_as_a_devices_memory_viz_snapshot(tmp_path, capsys):
    out = tmp_path / "cpu.pickle"
    assert main(["export", str(need(CPU_MLP)), "-f", "memory-viz", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "the CPU's memory" in err[-1] and not out.exists()
