"""memtrace's switches join vLLM's Ray copy list without touching the user's entries; the run's manifest
says which rank's trace is where, and ``memtrace run`` waits for and names traces left on other nodes."""

from __future__ import annotations

import sys
from pathlib import Path

from memtrace import facts as F
from memtrace.capture import ray_gather
from memtrace.cli import main
from memtrace.cli import run as run_cmd
from memtrace.gather import MANIFEST, Manifest, Placed, elsewhere, read_manifest, write_manifest
from memtrace.model import Process, Trace
from memtrace.plugins import ray_env
from memtrace.store import save_trace

PREFIXES = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"


def test_memtraces_switches_join_the_copy_list_vllm_returns_and_nothing_else_changes(monkeypatch):
    monkeypatch.setenv("MEMTRACE", "1")
    monkeypatch.setenv("MEMTRACE_DIR", "/r")
    monkeypatch.setenv(PREFIXES, "MYCO_")
    copied = {"VLLM_X", "HF_HOME"}
    hook = ray_env.CopyListHook()
    hook.after(hook.before(None, (), {}), copied, None)
    assert {"MEMTRACE", "MEMTRACE_DIR", "VLLM_X", "HF_HOME"} <= copied
    assert ray_env.switches({"MEMTRACEX": "1", "MYCO_A": "1", "MEMTRACE_UNTIL": "exit"}) == {
        "MEMTRACEX",
        "MEMTRACE_UNTIL",
    }
    failed = set()
    hook.after(True, failed, RuntimeError("vLLM raised"))  # vLLM's own error: its result is not touched
    assert failed == set()


def test_memtrace_run_changes_no_variable_vllm_hashes_into_its_compile_cache_and_names_this_host_the_driver():
    env = run_cmd.child_environment({PREFIXES: "MYCO_"}, Path("/r"), "startup", ["vllm"])
    assert env[PREFIXES] == "MYCO_"
    assert not [k for k in env if k.startswith("VLLM_") and k != PREFIXES]
    assert env["MEMTRACE_DRIVER_HOST"]


def test_a_plain_ray_program_gets_every_memtrace_switch_and_keeps_its_own_env_vars():
    environ = {"MEMTRACE_DIR": "/r", "MEMTRACE_RAY_COLLECTOR": "c", "HOME": "/h", "MEMTRACE": "1"}
    got = ray_gather.runtime_env({"pip": ["x"], "env_vars": {"MEMTRACE_DIR": "/mine", "A": "1"}}, environ)
    assert got == {
        "pip": ["x"],
        "env_vars": {"MEMTRACE_DIR": "/mine", "A": "1", "MEMTRACE_RAY_COLLECTOR": "c", "MEMTRACE": "1"},
    }


def test_a_session_outside_a_ray_worker_is_never_tied_to_a_collector(tmp_path):
    # a collector named, but Ray not initialised in this process: the session writes where it always did
    assert ray_gather.link_for(tmp_path / "x.memtrace", {"MEMTRACE_RAY_COLLECTOR": "c"}) is None
    assert ray_gather.link_for(tmp_path / "x.memtrace", {}) is None


def _manifest(run_dir: Path) -> Manifest:
    m = Manifest(driver={"host": "head", "node_id": "n0", "node_ip": "10.0.0.1", "run_dir": str(run_dir)})
    m.traces["head-pid1-rank0.memtrace"] = Placed(
        "head-pid1-rank0.memtrace", 0, 1, "head", "n0", "10.0.0.1", str(run_dir / "head-pid1-rank0.memtrace"), "here"
    )
    m.traces["b-pid7-rank1.memtrace"] = Placed(
        "b-pid7-rank1.memtrace",
        1,
        7,
        "b",
        "n1",
        "10.0.0.2",
        "/tmp/ray/memtrace/run/b-pid7-rank1.memtrace",
        "failed",
        error="ConnectionError: driver gone",
    )
    return m


def test_the_manifest_round_trips_and_lists_what_is_not_in_the_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    write_manifest(run_dir, _manifest(run_dir))
    assert [p.name for p in run_dir.iterdir()] == [MANIFEST]  # written atomically: no temporary left
    back = read_manifest(run_dir)
    assert back.traces == _manifest(run_dir).traces and back.driver["node_ip"] == "10.0.0.1"
    assert [p.rank for p in elsewhere(run_dir)] == [0, 1]
    save_trace(Trace(process=Process(pid=1, hostname="head", rank=0)), run_dir / "head-pid1-rank0.memtrace")
    (missing,) = elsewhere(run_dir)
    assert missing.fetch_hint(run_dir) == f"scp 10.0.0.2:/tmp/ray/memtrace/run/b-pid7-rank1.memtrace {run_dir}/"


def test_a_run_without_ray_workers_has_no_manifest_and_nothing_elsewhere(tmp_path):
    assert read_manifest(tmp_path) is None and elsewhere(tmp_path) == []
    (tmp_path / MANIFEST).write_text("{not json")
    assert read_manifest(tmp_path) is None


def test_memtrace_run_counts_a_trace_left_on_another_node_as_not_done_and_says_how_to_fetch_it(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_manifest(run_dir, _manifest(run_dir))
    save_trace(
        Trace(process=Process(pid=1, hostname="head", rank=0), facts={F.VLLM_STARTUP_COMPLETE_US: 5}),
        run_dir / "head-pid1-rank0.memtrace",
    )
    assert run_cmd.startup_state(run_dir) == (2, 1)  # rank 1 is expected, not here
    # the traced command exits before the run is complete: memtrace run prints the summary of what is here
    assert main(["run", "--dir", str(run_dir), "--force", "--", sys.executable, "-c", "pass"]) == 0
    err = capsys.readouterr().err
    assert (
        "memtrace: rank 1's trace is on node 10.0.0.2 (host b), not here (ConnectionError: driver gone): "
        f"scp 10.0.0.2:/tmp/ray/memtrace/run/b-pid7-rank1.memtrace {run_dir}/"
    ) in err


def test_the_collector_takes_only_trace_file_names():
    import pytest

    ray_gather.check_trace_name("vm-pid7-rank1.memtrace")
    for bad in ("../x.memtrace", "/etc/x.memtrace", "a/b.memtrace", "x.sqlite", ".memtrace", "x.memtrace/.."):
        with pytest.raises(ValueError):
            ray_gather.check_trace_name(bad)
