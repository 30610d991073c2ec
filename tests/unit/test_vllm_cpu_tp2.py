"""The real TP=2 start-ups recorded on this machine (``tests/data/vllm-cpu-tp2``, see its README): vLLM's
multiprocess executor under ``memtrace run`` and ``MEMTRACE=1``, and its Ray executor over two Ray nodes,
the second with a clock 4 s ahead. Read back without vLLM or Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
from aligned_clocks import alignment
from memtrace import facts as F
from memtrace.cli import main
from memtrace.gather import elsewhere, read_manifest
from memtrace.store import load_run
from testdata import DATA

HERE = DATA / "vllm-cpu-tp2"
PHASES = [
    "init_device",
    "load_model",
    "determine_available_memory",
    "profile_run",
    "kv_cache_init",
    "compile_or_warm_up",
]


def _phase(trace, name: str):
    return next(p for p in trace.phases if p.name == name)


@pytest.mark.parametrize("folder", ["memtrace-run", "memtrace-env", "ray-two-nodes"])
def test_each_recorded_tp2_run_holds_one_trace_per_rank_with_every_phase(folder):
    run = load_run(HERE / folder)
    assert [(t.process.rank, t.process.local_rank, t.process.world_size) for t in run.traces] in (
        [(0, 0, 2), (1, 1, 2)],
        [(0, 0, 2), (1, 0, 2)],  # Ray: each node's worker is its node's local rank 0
    )
    for trace in run.traces:
        assert [p.name for p in trace.phases] == PHASES
        assert trace.facts[F.VLLM_CONFIG]["tensor_parallel_size"] == 2
        assert trace.facts[F.VLLM_VERSION] == "0.32.0"
        assert trace.recording.end_reason == "startup-complete"


@pytest.mark.parametrize("folder", ["memtrace-run", "memtrace-env"])
def test_the_multiprocess_workers_share_the_drivers_clock(folder):
    traces = load_run(HERE / folder).traces
    assert [t.facts[F.CLOCK]["method"] for t in traces] == ["same-host", "same-host"]
    assert alignment(traces).statement == "one clock: all 2 traces were recorded on the driver's host (vm)"
    # one RPC starts the KV cache on both workers: on one clock they start within 10 ms
    starts = [_phase(t, "kv_cache_init").start_us for t in traces]
    assert abs(starts[1] - starts[0]) < 10_000


def test_the_ray_run_measured_the_second_nodes_4_s_skew_and_aligns_its_phases():
    traces = load_run(HERE / "ray-two-nodes").traces
    by_node = {t.facts[F.RAY]["on_driver_node"]: t for t in traces}
    local, remote = by_node[True], by_node[False]
    assert remote.facts[F.CLOCK]["offset_us"] == -3_999_918 and remote.facts[F.CLOCK]["uncertainty_us"] == 480
    assert local.facts[F.CLOCK]["offset_us"] == 41 and local.facts[F.CLOCK]["uncertainty_us"] == 386
    raw = _phase(remote, "kv_cache_init").start_us - _phase(local, "kv_cache_init").start_us
    assert raw == 4_003_316  # as recorded: the remote clock runs 4 s ahead
    a = alignment(traces)
    aligned = [r.to_driver_us(_phase(t, "kv_cache_init").start_us) for r, t in zip(a.ranks, traces, strict=True)]
    assert abs(aligned[1] - aligned[0]) == 3_357  # 3.4 ms apart on the driver's clock
    assert a.statement == (
        "aligned to the driver's clock (vm) within ± 0.48 ms: rank 0 +0.000041 s ± 0.39 ms (ray, vm), "
        "rank 1 -3.999918 s ± 0.48 ms (ray, vm)"
    )


def test_the_ray_runs_manifest_places_each_rank_and_both_files_are_here():
    manifest = read_manifest(HERE / "ray-two-nodes")
    placed = {p.rank: p for p in manifest.traces.values()}
    assert (placed[0].status, placed[1].status) == ("here", "gathered")
    assert placed[1].bytes == (HERE / "ray-two-nodes" / placed[1].file).stat().st_size == 65_536
    assert "/n1/memtrace/trace/" in placed[1].local_path  # written on node 1's own Ray temporary folder
    assert elsewhere(HERE / "ray-two-nodes") == []


def test_memtrace_report_prints_a_section_per_rank_of_the_ray_run(capsys):
    assert main(["report", str(HERE / "ray-two-nodes")]) == 0
    out = capsys.readouterr().out
    assert out.count("memtrace report: rank ") == 2
    assert out.index("memtrace report: rank 0") < out.index("memtrace report: rank 1")


def test_the_recorded_files_are_small():
    assert sum(f.stat().st_size for f in Path(HERE).rglob("*") if f.is_file()) < 600_000
