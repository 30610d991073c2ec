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
    # FakeNVML: device-used bytes step up by 1 MiB every 5 ms, from 1 GiB.
    import time

    class NVMLError(Exception):
        pass

    _t0 = None

    class _Mem:
        def __init__(self, used):
            self.used, self.total, self.free = used, 80 << 30, (80 << 30) - used

    def nvmlInit():
        global _t0
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
        return _Mem((1 << 30) + steps * (1 << 20))
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
    w = sidecar._Writer(":memory:")
    values = [5, 5, 5, 7, 7, 7, 7, 5]
    for i, v in enumerate(values):
        w.add(1000 + i, v)
    w.hand_off(final=True)
    _, buf = w.queue.get_nowait()
    w.buf = buf
    pairs = list(zip(w.buf[0::2], w.buf[1::2], strict=True))
    assert pairs == [(1000, 5), (1002, 5), (1003, 7), (1006, 7), (1007, 5)]


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
