"""``memtrace window RUN``: every running worker of a serving run writes its window now, and no other process is
ever signalled (SIGUSR2 kills a process that does not catch it). Real processes on this CPU machine: a memtrace
session in serving mode (no allocator here: its window holds steps and notes), one still in start-up mode, and
unrelated processes a stale trace points at."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time

import pytest
from memtrace import facts as F
from memtrace.cli import main
from memtrace.model import Process, Recording, Trace
from memtrace.store import load_trace, save_trace

CHILD = textwrap.dedent(
    """
    import sys, time, memtrace
    session = memtrace.start(sys.argv[1], sidecar=False)
    if sys.argv[2] == "serving":
        session.enter_serving()
    print("ready", flush=True)
    time.sleep(120)
    """
)


def _child(tmp_path, mode: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), mode], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def test_a_serving_worker_writes_its_window_on_demand_and_keeps_running(tmp_path, capsys):
    proc = _child(tmp_path, "serving")
    try:
        assert main(["window", str(tmp_path), "--timeout", "20"]) == 0
        (path,) = tmp_path.glob("*.memtrace")
        w = load_trace(path).window
        assert w.reason == "signal:SIGUSR2" and w.writes == 1
        assert proc.poll() is None  # still serving
        assert main(["window", str(tmp_path), "--timeout", "20"]) == 0
        assert load_trace(path).window.writes == 2
    finally:
        _stop(proc)
    err = capsys.readouterr().err
    assert f"pid {proc.pid}: window written (signal:SIGUSR2, write 1): " in err


def test_a_worker_not_in_serving_mode_is_never_signalled(tmp_path, capsys):
    proc = _child(tmp_path, "startup")
    try:
        assert main(["window", str(tmp_path)]) == 2
        time.sleep(0.5)
        assert proc.poll() is None  # SIGUSR2 would have killed it
    finally:
        _stop(proc)
    err = capsys.readouterr().err
    assert "recorded without --until serving: it keeps no window" in err
    assert "no trace in" in err and "was recorded in serving mode: start it with --until serving" in err


def _stale_trace(tmp_path, pid: int, start_us: int) -> None:
    trace = Trace(
        process=Process(pid=pid, hostname=socket.gethostname(), role="vllm-worker"),
        recording=Recording(start_us=start_us),
        facts={F.SERVING: {"started_us": start_us}},
    )
    save_trace(trace, tmp_path / f"vm-pid{pid}.memtrace")


@pytest.mark.parametrize(
    "began_s_ago, said",
    [
        (3600, "is another process now (it started after this trace began): left alone"),  # a reused pid
        (-60, "does not catch SIGUSR2 (not serving yet?): not signalled, it would die"),  # the traced one, say
    ],
    ids=["reused-pid", "no-handler"],
)
def test_a_process_a_trace_points_at_is_left_alone_unless_it_is_the_tracer_and_catches_sigusr2(
    tmp_path, capsys, began_s_ago, said
):
    other = subprocess.Popen(["sleep", "60"])
    try:
        _stale_trace(tmp_path, other.pid, int((time.time() - began_s_ago) * 1e6))
        assert main(["window", str(tmp_path), "--timeout", "2"]) == 1  # a serving run, and nothing was written
        time.sleep(0.5)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
    assert f"pid {other.pid} {said}" in capsys.readouterr().err


def test_a_finished_worker_and_a_missing_run_are_each_one_clear_line(tmp_path, capsys):
    done = subprocess.Popen(["true"])
    done.wait()
    _stale_trace(tmp_path, done.pid, int(time.time() * 1e6))
    assert main(["window", str(tmp_path)]) == 1
    assert f"pid {done.pid} is not running: the window on disk is its last" in capsys.readouterr().err
    assert main(["window", str(tmp_path / "nope")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["window", str(empty)]) == 2
    assert "holds no trace file" in capsys.readouterr().err
