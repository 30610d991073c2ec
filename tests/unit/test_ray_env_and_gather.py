"""memtrace's switches join vLLM's Ray copy list without touching the user's entries; the run's manifest
says which rank's trace is where, and ``memtrace run`` waits for and names traces left on other nodes."""

from __future__ import annotations

from pathlib import Path

from memtrace import facts as F
from memtrace.capture import ray_gather
from memtrace.cli import run as run_cmd
from memtrace.gather import MANIFEST, Manifest, Placed, elsewhere, read_manifest, write_manifest
from memtrace.model import Process, Trace
from memtrace.plugins import ray_env
from memtrace.store import save_trace

PREFIXES = ray_env.PREFIXES_ENV


def test_memtrace_is_appended_to_the_users_ray_prefixes_which_stay_byte_for_byte():
    f = ray_env.prefixes_with_memtrace
    assert f(None) == "MEMTRACE" and f("") == "MEMTRACE" and f(" , ") == "MEMTRACE"
    assert f("MYCO_") == "MYCO_,MEMTRACE"
    assert f("MYCO_, OTHER_ ") == "MYCO_, OTHER_ ,MEMTRACE"  # the user's spelling, then ours
    assert f("A_,MEMTRACE") == "A_,MEMTRACE"  # already covered: unchanged
    assert f(" MEM ") == " MEM "  # vLLM strips tokens: ' MEM ' covers every MEMTRACE* name
    assert f("MEMTRACE_") == "MEMTRACE_,MEMTRACE"  # 'MEMTRACE_' misses the switch MEMTRACE itself


def test_carry_changes_only_the_prefix_variable_and_never_vllm_plugins():
    env = {PREFIXES: "MYCO_", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "X", "VLLM_PLUGINS": "a"}
    assert ray_env.carry(env) is True
    assert env == {PREFIXES: "MYCO_,MEMTRACE", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "X", "VLLM_PLUGINS": "a"}
    assert ray_env.carry(env) is False  # idempotent


def test_memtrace_run_carries_its_switches_to_ray_workers_and_names_this_host_the_driver():
    env = run_cmd.child_environment({PREFIXES: "MYCO_"}, Path("/r"), "startup", ["vllm"])
    assert env[PREFIXES] == "MYCO_,MEMTRACE"
    assert env["MEMTRACE_DRIVER_HOST"]
    assert "VLLM_PLUGINS" not in env


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
    run_cmd._summary(run_dir, 100)
    err = capsys.readouterr().err
    assert (
        "memtrace: rank 1's trace is on node 10.0.0.2 (host b), not here (ConnectionError: driver gone): "
        f"scp 10.0.0.2:/tmp/ray/memtrace/run/b-pid7-rank1.memtrace {run_dir}/"
    ) in err


def test_the_collector_takes_only_trace_file_names():
    import pytest

    ray_gather._check_name("vm-pid7-rank1.memtrace")
    for bad in ("../x.memtrace", "/etc/x.memtrace", "a/b.memtrace", "x.sqlite", ".memtrace", "x.memtrace/.."):
        with pytest.raises(ValueError):
            ray_gather._check_name(bad)
