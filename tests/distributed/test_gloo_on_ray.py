"""A real gloo program on Ray actors across two Ray nodes: the second node's trace reaches the run directory
through Ray, and its deliberately skewed clock is measured and aligned.

The cluster is Ray's own multi-node test cluster on this machine: two nodes, each with its own Ray
temporary folder (its own "disk"); node 1's raylet, hence every worker it starts, runs with memtrace's clock
5 s ahead (the test-only ``tests/worker_shim/mt_test_clock_skew.py``): a host whose clock is off. Nothing of memtrace is in the
nodes' environment: only what the driver carries reaches the actors.
"""

from __future__ import annotations

import filecmp
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed here; .ci/setup installs it (pip install 'ray==2.60.*')")

from aligned_clocks import alignment  # noqa: E402
from memtrace import facts as F  # noqa: E402
from memtrace.cli import main  # noqa: E402
from memtrace.gather import elsewhere, read_manifest  # noqa: E402
from memtrace.store import load_run  # noqa: E402
from ray_cluster import ray_cluster, worker_shim  # noqa: E402

pytestmark = pytest.mark.ray

HERE = Path(__file__).resolve().parent
SKEW_US = 5_000_000


def _run_program(cluster: dict, run_dir: Path, *extra: str) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            str(HERE / "gloo_program.py"),
            "--address",
            cluster["address"],
            "--run-dir",
            str(run_dir),
            *extra,
        ],
        env=cluster["env"],
        cwd=cluster["root"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs():
    nodes = [
        {"num_cpus": 1, "resources": {"node0": 1}},
        {"num_cpus": 1, "resources": {"node1": 1}, "env_vars": worker_shim(clock_skew_us=SKEW_US)},
    ]
    with ray_cluster(nodes) as cluster:
        carried = _run_program(cluster, cluster["root"] / "run")
        bare = _run_program(cluster, cluster["root"] / "run-bare", "--no-carry")
        dropped = _run_program(cluster, cluster["root"] / "run-dropped", "--drop-collector")
        node1_files = sorted((cluster["temp_dirs"][1] / "memtrace" / "run").glob("*.memtrace"))
        node1_copy = {f.name: f.read_bytes() for f in node1_files}
        run = load_run(cluster["root"] / "run")
        manifest = read_manifest(cluster["root"] / "run")
        yield {
            "cluster": cluster,
            "carried": carried,
            "bare": bare,
            "dropped": dropped,
            "dropped_dir": cluster["root"] / "run-dropped",
            "run": run,
            "manifest": manifest,
            "node1_copy": node1_copy,
            "bare_dir": cluster["root"] / "run-bare",
            "run_dir": cluster["root"] / "run",
        }


def test_the_gloo_program_really_ran_across_two_nodes(runs):
    ranks = runs["carried"]["ranks"]
    assert [r["sum"] for r in ranks] == [3.0, 3.0]  # all_reduce of 1 and 2
    assert ranks[0]["node_id"] == runs["carried"]["driver_node_id"]
    assert ranks[1]["node_id"] != runs["carried"]["driver_node_id"]


def test_the_second_nodes_trace_arrives_in_the_run_directory_through_ray(runs):
    run_dir = runs["run_dir"]
    rank1 = runs["carried"]["ranks"][1]
    local = Path(rank1["path"])  # where rank 1 wrote: node 1's own Ray temporary folder
    assert local.parent == runs["cluster"]["temp_dirs"][1] / "memtrace" / "run"
    assert [t.process.rank for t in runs["run"].traces] == [0, 1]
    arrived = run_dir / local.name
    assert runs["node1_copy"][local.name] == arrived.read_bytes()  # byte for byte
    placed = runs["manifest"].traces[local.name]
    assert (placed.status, placed.rank, placed.bytes) == ("gathered", 1, arrived.stat().st_size)
    assert placed.local_path == str(local)
    trace1 = runs["run"].traces[1]
    assert trace1.facts[F.RAY]["on_driver_node"] is False
    assert trace1.facts[F.RAY]["node_id"] == rank1["node_id"]
    assert [p.name for p in trace1.phases] == ["init_process_group", "all_reduce", "barrier"]


def test_the_driver_nodes_trace_is_written_in_place(runs):
    rank0 = runs["carried"]["ranks"][0]
    assert Path(rank0["path"]).parent == runs["run_dir"]
    placed = runs["manifest"].traces[Path(rank0["path"]).name]
    assert placed.status == "here"
    assert filecmp.cmp(rank0["path"], runs["run_dir"] / Path(rank0["path"]).name)


def test_the_skewed_workers_clock_offset_is_measured_within_its_uncertainty(runs):
    clock0, clock1 = (t.facts[F.CLOCK] for t in runs["run"].traces)
    assert clock1["method"] == "ray" and clock1["rounds"] == 8
    assert 0 < clock1["uncertainty_us"] < 50_000
    assert abs(clock1["offset_us"] + SKEW_US) <= clock1["uncertainty_us"]
    assert clock0["method"] == "ray"  # on the driver's node, measured all the same: 0 within its uncertainty
    assert abs(clock0["offset_us"]) <= clock0["uncertainty_us"]


def test_alignment_brings_both_ranks_barrier_to_one_moment(runs):
    traces = runs["run"].traces
    ends = [next(p.end_us for p in t.phases if p.name == "barrier") for t in traces]
    assert 4_900_000 < ends[1] - ends[0] < 5_100_000  # as recorded: rank 1's clock is 5 s ahead
    a = alignment(traces)
    assert a.aligned and a.ranks[1].offset_us == traces[1].facts[F.CLOCK]["offset_us"]
    aligned = [r.to_driver_us(e) for r, e in zip(a.ranks, ends, strict=True)]
    # both leave the barrier together (the true times each rank read right after it differ by far less)
    true_gap = abs(
        runs["carried"]["ranks"][1]["after_barrier_true_us"] - runs["carried"]["ranks"][0]["after_barrier_true_us"]
    )
    assert abs(aligned[1] - aligned[0]) <= true_gap + a.uncertainty_us + 20_000
    assert a.statement.startswith("aligned to the driver's clock (")
    assert re.search(r"rank 1 -(4\.99|5\.00)\d+ s ± \d+\.\d\d ms \(ray, ", a.statement), a.statement


def test_without_carrying_memtraces_switches_no_trace_reaches_the_run_directory(runs):
    # the same program, its actors given nothing: they record, but where the driver never sees it
    assert not runs["bare_dir"].exists()
    for rank in runs["bare"]["ranks"]:
        assert "MEMTRACE_RAY_COLLECTOR" not in rank["memtrace_env"]
        assert Path(rank["path"]).parent != runs["bare_dir"]


def test_a_trace_that_cannot_reach_the_driver_stays_on_its_node_and_the_run_says_where(runs, capsys):
    run_dir = runs["dropped_dir"]
    rank1 = runs["dropped"]["ranks"][1]
    assert [t.process.rank for t in load_run(run_dir).traces] == [0]  # rank 1 never arrived
    (missing,) = elsewhere(run_dir)
    assert (missing.rank, missing.status, missing.local_path) == (1, "on-node", rank1["path"])
    assert load_run(rank1["path"]).traces[0].process.rank == 1  # complete, on node 1's own disk
    # the traced command exits before the run is complete: memtrace run prints the summary of what is here
    assert main(["run", "--dir", str(run_dir), "--force", "--", sys.executable, "-c", "pass"]) == 0
    err = capsys.readouterr().err
    assert (
        f"memtrace: rank 1's trace is on node {missing.node_ip} (host {missing.host}), not here (not handed over yet): "
        in err
    )
    assert f"scp {missing.node_ip}:{rank1['path']} {run_dir}/" in err
