"""``memtrace run``: the child's environment, exit codes, signal forwarding, start-up detection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from memtrace import facts as F
from memtrace.cli import run as run_cmd
from memtrace.model import Phase, Process, Trace
from memtrace.store import TraceWriter, read_fact, save_trace
from testdata import DATA


def test_child_environment_leaves_vllm_plugins_unset_and_turns_memtrace_on_by_its_own_switch():
    """VLLM_PLUGINS is vLLM's allow-list for every plugin group: memtrace run must not set it."""
    env = run_cmd.child_environment({"PATH": "/bin"}, Path("/r"), "exit", ["vllm", "serve", "--api-key", "k"])
    assert "VLLM_PLUGINS" not in env and env["PATH"] == "/bin"
    assert env["MEMTRACE"] == "1" and env["MEMTRACE_DIR"] == "/r" and env["MEMTRACE_UNTIL"] == "exit"
    assert json.loads(env["MEMTRACE_CMDLINE"]) == ["vllm", "serve", "--api-key", "<redacted>"]


def test_a_users_vllm_plugins_keeps_its_plugins_and_gains_memtrace():
    def plugins(value):
        return run_cmd.child_environment({"VLLM_PLUGINS": value}, Path("/r"), "startup", ["x"])["VLLM_PLUGINS"]

    assert plugins("lora_filesystem_resolver") == "lora_filesystem_resolver,memtrace"
    assert plugins("a,memtrace,b") == "a,memtrace,b"  # already there: unchanged
    assert plugins("a, b") == "a, b,memtrace"  # the user's spelling is kept (vLLM does not strip)
    assert plugins("a, memtrace") == "a, memtrace,memtrace"  # vLLM would not match " memtrace"
    assert plugins("") == "memtrace"  # set but empty: vLLM loads nothing, so memtrace alone


def test_exit_codes_are_the_shells():
    assert run_cmd.exit_code(0) == 0 and run_cmd.exit_code(3) == 3 and run_cmd.exit_code(-15) == 143


@pytest.mark.parametrize("name", ["run", "run#1", "run?x=1", "50%", "a b"])
def test_startup_is_detected_from_the_traces_fact_whatever_the_folder_name(tmp_path, name):
    """Issue 10 defect 13: 'run#1' was read through an unquoted SQLite URI and never seen complete."""
    run_dir = tmp_path / name
    assert run_cmd.startup_state(run_dir) == (0, 0)  # not created yet
    run_dir.mkdir()
    save_trace(Trace(process=Process(pid=1), facts={F.VLLM_STARTUP_COMPLETE_US: 5}), run_dir / "a.memtrace")
    with TraceWriter(run_dir / "b.memtrace") as w:  # still recording: no fact yet
        w.add_phase(Phase("init_device", 1, 2))
        assert run_cmd.startup_state(run_dir) == (2, 1)
    (run_dir / "c.memtrace").write_bytes(b"")  # being created
    assert run_cmd.startup_state(run_dir) == (3, 1)


def test_read_fact_reads_a_live_file_and_never_raises(tmp_path):
    path = tmp_path / "x#y.memtrace"
    assert read_fact(path, F.VLLM_VERSION) is None
    with TraceWriter(path) as w:
        w.set_facts({F.VLLM_VERSION: "0.32.0"})
        assert read_fact(path, F.VLLM_VERSION) == "0.32.0"
        assert read_fact(path, F.VLLM_STARTUP_COMPLETE_US) is None
    path.write_bytes(b"not sqlite at all")
    assert read_fact(path, F.VLLM_VERSION) is None


def _memtrace_run(tmp_path: Path, script: str, name: str = "run") -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMTRACE", "VLLM_PLUGINS"))}
    return subprocess.Popen(
        [sys.executable, "-m", "memtrace", "run", "--dir", str(tmp_path / name), "--", sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


#: A stand-in for a vLLM worker (named so): writes a finished start-up trace where the plugin would,
#: then keeps "serving" for a while, as vLLM does after start-up.
FAKE_WORKER = """
import os, time
from memtrace import facts as F
from memtrace.model import Phase, Process, Trace
from memtrace.store import save_trace
trace = Trace(process=Process(pid=os.getpid()), facts={F.VLLM_STARTUP_COMPLETE_US: 2_000_000})
trace.phases = [Phase("init_device", 0, 1_000_000, source="vllm"), Phase("load_model", 1_000_000, 2_000_000, source="vllm")]
os.makedirs(os.environ["MEMTRACE_DIR"], exist_ok=True)
save_trace(trace, os.path.join(os.environ["MEMTRACE_DIR"], "vm-pid1-rank0.memtrace"))
print("serving", flush=True)
time.sleep(4)
"""


def test_a_run_folder_named_run_hash_1_sees_startup_complete_while_the_command_runs(tmp_path):
    proc = _memtrace_run(tmp_path, FAKE_WORKER, name="run#1")
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    assert f"start-up complete; traces in {tmp_path / 'run#1'}" in err and "before start-up completed" not in err
    assert "load_model" in out  # the summary, printed while the command was still running
    assert out.index("serving") < out.index("load_model")


def test_the_exit_code_is_the_commands(tmp_path):
    script = "import os, sys; print(os.environ.get('VLLM_PLUGINS'), os.environ['MEMTRACE']); sys.exit(7)"
    proc = _memtrace_run(tmp_path, script)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7 and out.strip() == "None 1"
    assert "exited (7) before start-up completed" in err
    # nothing recorded (the H100 rescues vLLM refused in init_device left no trace): said, not a bare exit
    assert "no trace was written" in err and "init_device" in err


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


def test_a_command_that_died_of_oom_gets_its_summary_and_the_error_is_named_as_vllms(tmp_path):
    """The real 16 GiB-card H200 start-up that died of CUDA OOM, copied where a worker would write it
    by a stand-in command that then exits 1 (as vLLM does when its engine dies)."""
    real = DATA / "h200" / "startup-cap16g" / "vm-pid552.memtrace"
    script = (
        "import os, shutil, sys\n"
        "os.makedirs(os.environ['MEMTRACE_DIR'])\n"
        f"shutil.copy({str(real)!r}, os.environ['MEMTRACE_DIR'])\n"
        "sys.exit(1)\n"
    )
    proc = _memtrace_run(tmp_path, script)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "exited (1) before start-up completed" in err
    assert "ran out of GPU memory in" in err and "vLLM's/PyTorch's, not memtrace's" in err
    assert "OOM" in out or "out of memory" in out.lower()


@pytest.mark.parametrize(
    ("cupti", "expected"),
    [(None, (None, None)), ("off", ("0", "0")), ("records", ("1", "0")), ("stacks", ("1", "1"))],
)
def test_the_cupti_switches_reach_the_child(cupti, expected):
    env = run_cmd.child_environment({"PATH": "/bin"}, Path("/r"), "startup", ["x"], cupti)
    assert (env.get("MEMTRACE_CUPTI"), env.get("MEMTRACE_CUPTI_STACKS")) == expected


def test_cupti_without_cupti_python_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    import importlib.util

    from memtrace.cli import main

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cupti" else object())
    run_dir = tmp_path / "run"
    assert main(["run", "--dir", str(run_dir), "--cupti", "records", "--", sys.executable, "-c", "pass"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install memtrace-vllm[cupti]" in err
    assert not run_dir.exists()  # nothing ran, nothing was created


def test_cupti_stacks_turn_both_switches_on_in_the_command(tmp_path, capfd, monkeypatch):
    import importlib.util

    from memtrace.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "cupti" else real(name, *a))
    code = "import os; print('cupti', os.environ['MEMTRACE_CUPTI'], os.environ['MEMTRACE_CUPTI_STACKS'])"
    monkeypatch.setenv("MEMTRACE_CUPTI", "0")  # the flag wins over the environment
    assert main(["run", "--dir", str(tmp_path / "run"), "--cupti", "stacks", "--", sys.executable, "-c", code]) == 0
    assert "cupti 1 1" in capfd.readouterr().out


def test_memtrace_dir_picks_the_run_directory_when_dir_is_not_given(tmp_path):
    """``MEMTRACE_DIR=runs/x memtrace run -- cmd`` records into runs/x (relative to the working directory),
    and the command sees that folder as its MEMTRACE_DIR."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMTRACE", "VLLM_PLUGINS"))}
    env["MEMTRACE_DIR"] = "runs/x"
    script = "import os; print(os.environ['MEMTRACE_DIR'])"
    done = subprocess.run(
        [sys.executable, "-m", "memtrace", "run", "--", sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    want = str((tmp_path / "runs" / "x").resolve())
    assert done.stdout.strip() == want
    assert f"memtrace: tracing into {want}" in done.stderr
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("memtrace-")]


@pytest.mark.parametrize(
    "knob, said",
    [
        ("MEMTRACE_SERVING_EVENTS=0", "MEMTRACE_SERVING_EVENTS='0' must be at least 1"),
        ("MEMTRACE_SERVING_STACKS=some", "MEMTRACE_SERVING_STACKS='some': give one of none, python, all"),
    ],
)
def test_a_bad_serving_knob_is_one_line_and_exit_2_before_the_command_starts(tmp_path, capsys, monkeypatch, knob, said):
    from memtrace.cli import main

    name, value = knob.split("=")
    monkeypatch.setenv(name, value)
    marker = tmp_path / "started"
    code = main(["run", "--dir", str(tmp_path / "run"), "--until", "serving", "--", sys.executable, "-c",
                 f"open({str(marker)!r}, 'w')"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()
