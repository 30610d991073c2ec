"""``memtrace run``: the child's environment, exit codes, signal forwarding, start-up detection."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from memtrace.cli import run as run_cmd
from memtrace.model import Phase, Process, Trace
from memtrace.store import TraceWriter, save_trace


def test_child_environment_adds_memtrace_to_the_listed_plugins():
    env = run_cmd.child_environment(
        {"VLLM_PLUGINS": "a, b", "PATH": "/bin"}, Path("/r"), "exit", ["vllm", "serve", "--api-key", "k"]
    )
    assert env["VLLM_PLUGINS"] == "a,b,memtrace" and env["PATH"] == "/bin"
    assert env["MEMTRACE_DIR"] == "/r" and env["MEMTRACE_UNTIL"] == "exit"
    assert json.loads(env["MEMTRACE_CMDLINE"]) == ["vllm", "serve", "--api-key", "<redacted>"]
    assert run_cmd.child_environment({}, Path("/r"), "startup", ["x"])["VLLM_PLUGINS"] == "memtrace"
    assert (
        run_cmd.child_environment({"VLLM_PLUGINS": "memtrace"}, Path("/r"), "startup", ["x"])["VLLM_PLUGINS"]
        == "memtrace"
    )


def test_exit_codes_are_the_shells():
    assert run_cmd.exit_code(0) == 0 and run_cmd.exit_code(3) == 3 and run_cmd.exit_code(-15) == 143


def test_startup_is_detected_from_the_traces_fact(tmp_path):
    assert run_cmd.startup_state(tmp_path) == (0, 0)
    save_trace(Trace(process=Process(pid=1), facts={"vllm.startup_complete_us": 5}), tmp_path / "a.memtrace")
    with TraceWriter(tmp_path / "b.memtrace") as w:  # still recording: no fact yet
        w.add_phase(Phase("init_device", 1, 2))
        assert run_cmd.startup_state(tmp_path) == (2, 1)


def _memtrace_run(tmp_path: Path, script: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "memtrace", "run", "--dir", str(tmp_path / "run"), "--", sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_exit_code_is_the_commands(tmp_path):
    proc = _memtrace_run(tmp_path, "import os, sys; print(os.environ['VLLM_PLUGINS']); sys.exit(7)")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7 and out.strip() == "memtrace"
    assert "exited (7) before start-up completed" in err


def test_sigterm_is_forwarded_to_the_command(tmp_path):
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(42)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = _memtrace_run(tmp_path, script)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.terminate()
    out, _ = proc.communicate(timeout=60)
    assert "got TERM" in out and proc.returncode == 42


def test_an_existing_run_dir_with_traces_needs_force(tmp_path):
    (tmp_path / "run").mkdir()
    save_trace(Trace(), tmp_path / "run" / "x.memtrace")
    proc = _memtrace_run(tmp_path, "pass")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "already holds traces" in err and "--force" in err
