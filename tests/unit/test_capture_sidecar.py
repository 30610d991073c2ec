"""The NVML sidecar process, run for real against a fake NVML (no GPU here; named FakeNVML).

The fake ``pynvml`` module is put first on the sidecar's PYTHONPATH; everything else (the process,
the pipe protocol, the SQLite writes, the compression, the parent-death watch) is the real code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from memtrace.capture import sidecar
from memtrace.store import TraceWriter, load_trace

FAKE_NVML = textwrap.dedent(
    """
    # FakeNVML: device-used bytes step up by 1 MiB every 5 ms, from 1 GiB (plus other processes').
    import os
    import time

    class NVMLError(Exception):
        pass

    _t0 = None

    class _Mem:
        def __init__(self, used):
            self.used, self.total, self.free = used, 80 << 30, (80 << 30) - used

    def nvmlInit():
        global _t0
        time.sleep(float(os.environ.get("FAKE_NVML_INIT_S", "0")))  # NVML can take a second to start
        _t0 = time.monotonic()

    def nvmlShutdown():
        pass

    def nvmlDeviceGetHandleByUUID(uuid):
        if uuid != "GPU-fake":
            raise NVMLError("Not Found")
        return "h"

    def nvmlDeviceGetHandleByPciBusId(pci):
        raise NVMLError("Not Found")

    def nvmlDeviceGetHandleByIndex(i):
        return "h"

    def nvmlDeviceGetName(h):
        return "FakeNVML GPU"

    def nvmlSystemGetDriverVersion():
        return "0.0"

    def nvmlDeviceGetMemoryInfo(h):
        steps = int((time.monotonic() - _t0) / 0.005)
        return _Mem((1 << 30) + steps * (1 << 20) + _others_bytes())

    # The per-process list: the traced process (the sidecar's parent) holds 512 MiB; other processes
    # are described by $FAKE_NVML_OTHERS, "pid:bytes,pid:bytes" ("pid:na" = figure not available).
    class _Proc:
        def __init__(self, pid, used):
            self.pid, self.usedGpuMemory = pid, used

    def _others():
        spec = os.environ.get("FAKE_NVML_OTHERS", "")
        return [(int(p), None if b == "na" else int(b)) for p, b in (x.split(":") for x in spec.split(",") if x)]

    def _others_bytes():
        return sum(b or (1 << 30) for _, b in _others())

    def nvmlDeviceGetComputeRunningProcesses(h):
        me = int(os.environ.get("FAKE_NVML_TRACED_PID", os.getppid()))
        return [_Proc(me, 512 << 20)] + [_Proc(p, b) for p, b in _others()]
    """
)


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch):
    d = tmp_path / "fake"
    d.mkdir()
    (d / "pynvml.py").write_text(FAKE_NVML)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(d), os.environ.get("PYTHONPATH", "")]))
    return d


def _writer(tmp_path):
    w = TraceWriter(tmp_path / "t.memtrace")
    return w


def test_sidecar_writes_samples_on_the_unix_clock_and_stops_on_request(tmp_path, fake_nvml):
    w = _writer(tmp_path)
    t0 = time.time_ns() // 1000
    sc = sidecar.start_sidecar(w.path, {"gpu_uuid": "GPU-fake", "device_index": 0}, 1000.0)
    assert not isinstance(sc, str), sc
    assert sc.info["matched_by"] == "uuid"
    time.sleep(0.5)
    info = sc.stop()
    t1 = time.time_ns() // 1000
    w.close()
    trace = load_trace(w.path)
    s = trace.samples
    assert info["exit_code"] == 0
    assert info["taken"] > 200  # ~1 kHz for 0.5 s
    assert len(s) == info["kept"] > 0
    assert t0 <= s["time_us"][0] and s["time_us"][-1] <= t1
    assert np.all(np.diff(s["time_us"]) > 0)
    assert np.all(np.diff(s["used_bytes"]) >= 0)
    assert s["used_bytes"][0] >= 1 << 30


def test_compression_keeps_every_step_and_the_sample_before_it():
    series = sidecar.StepSeries()
    values = [5, 5, 5, 7, 7, 7, 7, 5]
    for i, v in enumerate(values):
        series.add(1000 + i, v)
    buf = series.take(final=True)
    pairs = list(zip(buf[0::2], buf[1::2], strict=True))
    assert pairs == [(1000, 5), (1002, 5), (1003, 7), (1006, 7), (1007, 5)]
    assert series.kept == 5 and series.take(final=True) is None


def test_sidecar_flushes_and_exits_when_its_parent_is_killed(tmp_path, fake_nvml):
    w = _writer(tmp_path)
    w.close()
    code = textwrap.dedent(
        f"""
        import sys, time
        from memtrace.capture import sidecar
        sc = sidecar.start_sidecar({str(w.path)!r}, {{"gpu_uuid": "GPU-fake"}}, 1000.0)
        print(sc.proc.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    time.sleep(0.4)
    parent.kill()
    parent.wait()
    deadline = time.time() + 5
    while os.path.exists(f"/proc/{pid}") and "Z" not in open(f"/proc/{pid}/stat").read().split()[2]:
        assert time.time() < deadline, "the sidecar outlived its parent"
        time.sleep(0.05)
    assert len(load_trace(w.path).samples) > 0


def test_an_unknown_gpu_is_reported_not_raised(tmp_path, fake_nvml):
    w = _writer(tmp_path)
    reason = sidecar.start_sidecar(w.path, {"gpu_uuid": "GPU-other", "device_index": 0}, 1000.0)
    w.close()
    assert isinstance(reason, str) and "not found by NVML" in reason


def _run_sidecar(tmp_path, monkeypatch, others: str, traced_pid: int | None = None, seconds: float = 0.4, **kw):
    monkeypatch.setenv("FAKE_NVML_OTHERS", others)
    if traced_pid is not None:
        monkeypatch.setenv("FAKE_NVML_TRACED_PID", str(traced_pid))
    w = _writer(tmp_path)
    gpu = {"gpu_uuid": "GPU-fake", "total_memory_bytes": (80 << 30) - (1 << 30)}  # driver reserve: 1 GiB
    sc = sidecar.start_sidecar(w.path, gpu, 1000.0, reserved_bytes=kw.get("reserved_bytes"))
    assert not isinstance(sc, str), sc
    time.sleep(seconds)
    if "hint_later" in kw:
        sc.hint(kw["hint_later"])
        time.sleep(seconds)
    info = sc.stop()
    w.close()
    return info, load_trace(w.path)


def test_other_processes_are_summed_from_the_per_process_list(tmp_path, fake_nvml, monkeypatch):
    info, trace = _run_sidecar(tmp_path, monkeypatch, f"4242:{3 << 30},4243:{1 << 29}")
    assert info["others_method"] == "per-process"
    assert info["traced_pids"] == [os.getpid()] and 4242 in info["nvml_pids"]
    o = trace.others
    assert len(o) == info["others_kept"] >= 2  # one value: the first sample and heartbeats
    assert set(o["others_bytes"].tolist()) == {(3 << 30) + (1 << 29)}
    assert o["time_us"][0] >= trace.samples["time_us"][0] - 1000 and np.all(np.diff(o["time_us"]) > 0)
    assert info["others_methods"]["per-process"] * 10 == pytest.approx(info["taken"], abs=10)  # every 10 ms


def test_an_unavailable_figure_falls_back_on_used_minus_ours(tmp_path, fake_nvml, monkeypatch):
    info, trace = _run_sidecar(tmp_path, monkeypatch, "4242:na")
    assert info["others_method"] == "used-minus-ours"
    o, s = trace.others, trace.samples
    # FakeNVML used = 1 GiB + steps + 1 GiB (the unknown process); minus the 1 GiB reserve and our 512 MiB
    used_at = s["used_bytes"][np.searchsorted(s["time_us"], o["time_us"], side="right") - 1]
    assert np.all(np.abs(o["others_bytes"] - (used_at - (1 << 30) - (512 << 20))) <= 1 << 20)  # one step apart


def test_our_process_not_found_records_no_others_and_says_so(tmp_path, fake_nvml, monkeypatch):
    info, trace = _run_sidecar(tmp_path, monkeypatch, f"4242:{3 << 30}", traced_pid=777_777)  # a host pid
    assert info["others_method"] == "not-found" and len(trace.others) == 0
    assert info["nvml_pids"] == [4242, 777_777]


def test_the_only_process_listed_is_ours(tmp_path, fake_nvml, monkeypatch):
    info, trace = _run_sidecar(tmp_path, monkeypatch, "", traced_pid=777_777)
    assert info["others_method"] == "per-process"
    assert set(trace.others["others_bytes"].tolist()) == {0}


def test_the_sidecar_starts_without_waiting_and_answers_on_a_thread(tmp_path, fake_nvml, monkeypatch):
    monkeypatch.setenv("FAKE_NVML_INIT_S", "1.0")
    w = _writer(tmp_path)
    answers = []
    t0 = time.perf_counter()
    sc = sidecar.start_sidecar(w.path, {"gpu_uuid": "GPU-fake"}, 1000.0, wait=False, on_ready=answers.append)
    returned_s = time.perf_counter() - t0
    bad = sidecar.start_sidecar(w.path, {"gpu_uuid": "GPU-other"}, 1000.0, wait=False, on_unavailable=answers.append)
    assert returned_s < 0.5  # the child's Python start and its 1 s nvmlInit are not waited for
    deadline = time.time() + 20
    while len(answers) < 2 and time.time() < deadline:  # both answers arrive on their threads
        time.sleep(0.05)
    time.sleep(0.2)
    sc.stop()
    bad.stop()
    w.close()
    assert [a["nvml_device"] for a in answers if isinstance(a, dict)] == ["FakeNVML GPU"]
    assert any(isinstance(a, str) and "not found by NVML" in a for a in answers)
    assert bad.unavailable and len(load_trace(w.path).samples) > 0


def test_inside_a_pid_namespace_our_process_is_found_by_its_memory(tmp_path, fake_nvml, monkeypatch):
    # NVML lists host pids (777777 is ours there); we hold 512 MiB, PyTorch reserved 0 at start
    info, trace = _run_sidecar(tmp_path, monkeypatch, f"4242:{12 << 30}", traced_pid=777_777, reserved_bytes=0)
    assert info["others_method"] == "per-process" and info["memory_matched_pid"] == 777_777
    assert set(trace.others["others_bytes"].tolist()) == {12 << 30}


def test_a_later_reserved_hint_finds_our_process(tmp_path, fake_nvml, monkeypatch):
    info, trace = _run_sidecar(tmp_path, monkeypatch, f"4242:{12 << 30}", traced_pid=777_777, hint_later=0)
    assert info["memory_matched_pid"] == 777_777
    assert info["others_methods"]["not-found"] > 0 and info["others_methods"]["per-process"] > 0
    assert set(trace.others["others_bytes"].tolist()) == {12 << 30}


def test_two_processes_that_could_be_ours_are_not_guessed(tmp_path, fake_nvml, monkeypatch):
    info, trace = _run_sidecar(tmp_path, monkeypatch, f"4242:{3 << 30}", traced_pid=777_777, reserved_bytes=0)
    assert info["others_method"] == "not-found" and info["memory_matched_pid"] is None and len(trace.others) == 0


@pytest.mark.parametrize("wait", [True, False])
def test_a_sidecar_not_waited_for_is_written_when_ready_and_said_late(tmp_path, wait):
    """vLLM's plugin does not wait for NVML's first samples on vLLM's thread (issue 42: 340-470 ms of its start):
    the sidecar's fact is then written the moment it answers (a SIGKILL later keeps it) and a note says from when
    device-level samples exist. The library's default still waits, and writes the fact with the next documents."""
    from memtrace.capture.session import Session

    s = Session(tmp_path / "t.memtrace", sample_hz=0, handle_signals=False, wait_for_sidecar=wait)
    s._sidecar_ready({"pid": 4242, "hz": 1000.0})
    trace = load_trace(tmp_path / "t.memtrace")  # read while recording: what a SIGKILL now would leave
    side = trace.facts.get("sidecar")
    notes = [n.text for n in trace.notes]
    if wait:
        assert side is None and not notes
    else:
        assert side["pid"] == 4242 and side["ready_after_start_ms"] >= 0
        assert any(t.startswith("NVML samples begin") and "not waited for" in t for t in notes), notes
    s.close("stop")
