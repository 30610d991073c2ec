"""The recording API on a machine without a GPU: phases, facts and notes are still recorded."""

from __future__ import annotations

import os
import socket

import memtrace
import pytest
from memtrace.capture.api import current_session
from memtrace.errors import UsageError
from memtrace.model import HookCall
from memtrace.store import load_run, load_trace


@pytest.fixture(autouse=True)
def _no_session_left():
    yield
    memtrace.stop()


def test_cpu_only_session_records_phases_facts_notes_and_hook_calls(tmp_path):
    with memtrace.trace(tmp_path, rank=3) as session:
        with memtrace.phase("load_model", source="vllm"):
            with memtrace.phase("inner"):
                session.set_fact("vllm.kv_cache_tokens", 1234)
        session.add_note("info", "hello")
        parent = session.record_hook_call(HookCall("ws", 1, 2, {"rows": 8}, 4096))
        session.record_hook_call(HookCall("inner_ws", 1, 2, parent=parent))
        session.flush()
    assert session.path == tmp_path / f"{socket.gethostname()}-pid{os.getpid()}-rank3.memtrace"
    trace = load_trace(session.path)
    assert [(p.name, p.parent, p.source) for p in trace.phases] == [("load_model", None, "vllm"), ("inner", 0, "user")]
    assert all(p.end_us >= p.start_us for p in trace.phases)
    assert trace.facts["vllm.kv_cache_tokens"] == 1234
    assert trace.process.rank == 3 and trace.process.pid == os.getpid()
    assert [c.name for c in trace.hook_calls] == ["ws", "inner_ws"] and trace.hook_calls[1].parent == 0
    texts = [n.text for n in trace.notes]
    assert "hello" in texts and any("no allocator events" in t for t in texts)
    assert len(trace.events) == 0 and trace.recording.end_reason == "stop"


def test_a_second_start_is_a_clear_error_and_leaves_the_first_intact(tmp_path):
    session = memtrace.start(tmp_path / "a")
    with pytest.raises(UsageError, match="already recording"):
        memtrace.start(tmp_path / "b")
    with memtrace.phase("still-recorded"):
        pass
    assert memtrace.stop() == session.path
    assert memtrace.stop() is None  # idempotent
    assert [p.name for p in load_trace(session.path).phases] == ["still-recorded"]
    assert not (tmp_path / "b").exists()


def test_phase_is_a_decorator_and_a_no_op_without_a_session(tmp_path):
    @memtrace.phase("step")
    def step(x):
        return x + 1

    assert step(1) == 2  # nothing records: still runs
    with memtrace.trace(tmp_path) as session:
        assert step(2) == 3 and step(3) == 4
    assert [p.name for p in load_trace(session.path).phases] == ["step", "step"]


def test_the_run_dir_comes_from_memtrace_dir_or_a_timestamp_exported_to_children(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMTRACE_DIR", str(tmp_path / "env-run"))
    with memtrace.trace() as session:
        pass
    assert session.path.parent == tmp_path / "env-run"
    monkeypatch.delenv("MEMTRACE_DIR")
    monkeypatch.chdir(tmp_path)
    with memtrace.trace() as session:
        pass
    assert session.path.parent.name.startswith("memtrace-")
    assert os.environ["MEMTRACE_DIR"] == str(session.path.parent)
    assert len(load_run(session.path.parent).traces) == 1


def test_an_exception_ends_the_recording_with_its_name_and_closes_open_phases(tmp_path):
    with pytest.raises(RuntimeError), memtrace.trace(tmp_path) as session:
        memtrace.phase("left-open").__enter__()
        raise RuntimeError("boom")
    trace = load_trace(session.path)
    assert trace.recording.end_reason == "exception:RuntimeError"
    assert trace.phases[0].end_us is not None
    assert current_session() is None


def test_environment_facts_are_recorded_without_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz")
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    with memtrace.trace(tmp_path) as session:
        pass
    env = load_trace(session.path).facts["env"]
    assert env["environ"]["HF_TOKEN"] == "<redacted>" and env["environ"]["VLLM_API_KEY"] == "<redacted>"
    assert env["torch"] and env["python"] and env["memtrace"] == memtrace.__version__
    assert "hf_abcdefghijklmnopqrstuvwxyz" not in str(env)


def test_using_phase_without_a_session_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, memtrace\nwith memtrace.phase('x'):\n    pass\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_phase_that_already_ended_is_added_with_its_own_times(tmp_path):
    from memtrace.capture import api
    from memtrace.store import load_trace

    with api.trace(tmp_path / "t.memtrace", sidecar=False) as session:
        session.add_phase("init_device", 1_000, 2_000, source="vllm")
        with api.phase("load_model"):
            session.add_phase("inner", 3_000, 4_000)
    phases = load_trace(tmp_path / "t.memtrace").phases
    assert [(p.name, p.start_us, p.end_us, p.source) for p in phases[:1]] == [("init_device", 1_000, 2_000, "vllm")]
    inner = next(p for p in phases if p.name == "inner")
    assert phases[inner.parent].name == "load_model"


_RECORD = """
import sys
import memtrace
with memtrace.trace(sys.argv[1]):
    with memtrace.phase("step"):
        sys.stdin.readline()  # the parent says when to stop
"""


def _record(folder, *, wait: bool = False):
    import subprocess
    import sys

    p = subprocess.Popen(
        [sys.executable, "-c", _RECORD, str(folder)],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "MEMTRACE_SAMPLE_HZ": "0"},
    )
    if not wait:
        return p
    _, err = p.communicate("\n", timeout=120)
    return p.returncode, err


def test_a_script_run_twice_into_one_folder_is_refused_the_second_time(tmp_path):
    """Issue 41 item 7: the second run never lands beside the first (report would refuse the folder)."""
    folder = tmp_path / "mine"
    code, err = _record(folder, wait=True)
    assert code == 0, err
    first = sorted(p.name for p in folder.iterdir())
    code, err = _record(folder, wait=True)
    assert code == 1
    assert f"UsageError: {folder} already holds a finished run ({first[0]}); a folder holds one run" in err
    assert sorted(p.name for p in folder.iterdir()) == first  # nothing added, nothing touched


def test_processes_recording_at_once_share_one_folder(tmp_path):
    """The other ranks of the same run (torchrun: every rank calls trace() on one folder) are welcome."""
    folder = tmp_path / "mine"
    first = _record(folder)
    import time

    for _ in range(600):  # until the first process's trace file exists
        if folder.is_dir() and any(folder.glob("*.memtrace")):
            break
        time.sleep(0.1)
    code, err = _record(folder, wait=True)
    _, err_first = first.communicate("\n", timeout=120)
    assert code == 0 and first.returncode == 0, (err, err_first)
    assert len(list(folder.glob("*.memtrace"))) == 2


def test_a_rank_recorded_twice_into_one_folder_is_refused(tmp_path):
    with memtrace.trace(tmp_path, rank=0):
        pass
    with pytest.raises(UsageError, match=r"already holds rank 0's trace \(.*-rank0\.memtrace\)"):
        memtrace.start(tmp_path, rank=0)
    with memtrace.trace(tmp_path, rank=1):  # another rank of the same run
        pass
    assert sorted(p.name.rsplit("-", 1)[1] for p in tmp_path.glob("*.memtrace")) == ["rank0.memtrace", "rank1.memtrace"]


def test_the_installed_versions_come_from_memtraces_own_thread_and_reach_the_trace(tmp_path):
    """What takes reading installed metadata is gathered off the program's thread; a vLLM (or anyone)
    setting facts["env"] meanwhile keeps its keys, and the trace holds both, with the process's start."""
    import threading
    import time

    from memtrace import facts as F
    from memtrace.capture import env as capture_env

    before = time.time_ns() // 1000
    with memtrace.trace(tmp_path) as session:
        thread = session._env_thread
        assert thread is not None and thread is not threading.current_thread()
        session.set_fact(F.ENV, {**session.facts[F.ENV], "cmdline": ["vllm", "serve", "m"]})  # as the plugin does
        thread.join(30)
    trace = load_trace(session.path)
    env = trace.facts["env"]
    installed = capture_env.installed_facts()
    assert env["platform"] == installed["platform"] and env["vllm_requires"] == installed["vllm_requires"]
    assert env["cmdline"] == ["vllm", "serve", "m"]
    assert 0 < trace.facts[F.PROCESS_START_US] < before  # this test process started before the session
    assert trace.facts[F.SELF_COST]["memtrace_threads_ns"] > 0  # the gathering, on memtrace's own thread


def test_a_second_start_into_the_folder_this_process_records_to_says_it_is_recording(tmp_path):
    """The earlier-run check runs inside the registry's claim, after its "already recording" check: the file of
    the session recording now is this process's, not a finished run's."""
    with memtrace.trace(tmp_path) as session:
        with pytest.raises(UsageError) as err:
            memtrace.start(tmp_path)
        assert (
            str(err.value)
            == f"memtrace is already recording this process to {session.path}; call memtrace.stop() first"
        )


def test_the_earlier_run_check_reads_trace_names_as_the_registry_makes_them(tmp_path):
    from memtrace.capture import registry

    for rank in (None, 0, 12):
        path = registry.trace_path(tmp_path / "run-pid3-rank4", rank)  # a folder whose name looks like one
        assert registry.name_parts(path.name) == (socket.gethostname(), os.getpid(), rank)
    assert registry.name_parts("my-host-pid7-rank2.memtrace.zst") == ("my-host", 7, 2)
    assert registry.name_parts("notes.memtrace") is None
