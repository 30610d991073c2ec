"""memtrace's own cost, measured where it is spent: exclusive per-source timing on the program's threads,
the hook wrapper timed apart from the wrapped call, the fact in every trace, the history's estimate
from a calibration, and the report's line (an older trace says it was not recorded).

Recording runs through memtrace's real Session and store with FakeTorch (tests/capture_fakes.py: no
CUDA here) replaying the real H200 start-up tests/data/h200/startup-full.
"""

from __future__ import annotations

import importlib.machinery
import io
import sys
import threading
import time
import types
from pathlib import Path

import pytest
from capture_fakes import session_with
from memtrace import facts as F
from memtrace.analysis.analysed.self_cost import HISTORY, history_estimate_ns, self_cost
from memtrace.capture import history_cost, selfcost
from memtrace.capture import session as S
from memtrace.model import ACTION_CODE
from memtrace.plots import cost_text
from memtrace.plots.text import render_report
from memtrace.plugins.hooks import HookManager, Target
from memtrace.store import load_trace
from references import snapshot_dict, summarize

FULL = Path(__file__).parents[1] / "data" / "h200" / "startup-full" / "vm-pid457.memtrace"


@pytest.fixture
def fresh():
    selfcost.reset()
    yield
    selfcost.reset()


class FakeClock:
    def __init__(self):
        self.t = 0

    def __call__(self):
        return self.t


def test_a_nested_region_is_charged_to_its_own_source_only(fresh, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(selfcost, "clock", clock)
    with selfcost.region("outer"):
        clock.t += 100
        with selfcost.region("inner"):
            clock.t += 30
            with selfcost.region("innermost"):
                clock.t += 5
        clock.t += 20
    got = selfcost.totals()
    assert {k: v["ns"] for k, v in got["sources"].items()} == {"outer": 120, "inner": 30, "innermost": 5}
    assert got["total_ns"] == 155 == clock.t


def test_the_hook_wrapper_is_timed_apart_from_the_wrapped_call(fresh):
    class Handler:
        key = "slow"
        cost_source = "phases"

        def before(self, target, args, kwargs):
            return True

        def after(self, token, result, error):
            pass

    module = types.ModuleType("selfcost_target")
    module.__spec__ = importlib.machinery.ModuleSpec("selfcost_target", None)

    def wrapped():
        time.sleep(0.05)
        return 7

    module.wrapped = wrapped
    sys.modules["selfcost_target"] = module
    manager = HookManager()
    try:
        manager.add(Target("selfcost_target", "wrapped"), Handler())
        start = time.perf_counter_ns()
        assert module.wrapped() == 7 and module.wrapped() == 7
        elapsed = time.perf_counter_ns() - start
    finally:
        manager.unpatch()
        del sys.modules["selfcost_target"]
    spent = selfcost.totals()["sources"]["hooks.phases"]
    assert spent["calls"] == 2  # two calls, each timed before and after the wrapped call
    assert 0 < spent["ns"] < 0.05 * elapsed  # the two 50 ms sleeps are vLLM's, not memtrace's


def test_memtraces_own_threads_are_reported_apart(fresh):
    def work():
        selfcost.mark_own_thread()
        with selfcost.region("background"):
            time.sleep(0.01)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    got = selfcost.totals()
    assert got["sources"] == {} and got["total_ns"] == 0
    assert got["memtrace_threads_ns"] >= 10_000_000


@pytest.fixture(scope="module")
def snap():
    return snapshot_dict(load_trace(FULL))


def _recorded(snap, path):
    s, fake = session_with(snap, path)
    share = len(fake.all_entries) // 4
    for name in ("load_model", "profile_run", "kv_cache_init", "capture_model"):
        token = s.phase_enter(name, source="vllm")
        fake.allocate(share)
        s.set_fact(F.MARKER, name)
        s.phase_exit(token)
    fake.allocate(len(fake.all_entries))
    s.close("stop")
    S.wait_finishing()
    return load_trace(path)


def test_every_trace_records_memtraces_time_by_source(snap, tmp_path, fresh):
    trace = _recorded(snap, tmp_path / "t.memtrace")
    fact = trace.facts[F.SELF_COST]
    assert fact["clock"] == "perf_counter_ns"
    sources = fact["sources"]
    assert {"phases", "writes", "drain.phase", "drain.stop", "stop"} <= set(sources)
    assert sources["phases"]["calls"] == 8  # four phases entered and left
    assert sources["drain.phase"]["ns"] > 0 and sources["writes"]["calls"] >= 4
    assert fact["total_ns"] == sum(v["ns"] for v in sources.values())
    assert fact["memtrace_threads_ns"] > 0  # the conversions ran on the background writer
    assert fact["history"]["recorded_allocs"] == int((trace.events["action"] == ACTION_CODE["alloc"]).sum())
    assert fact["history"]["measured"] is False  # FakeTorch: no calibration


def test_a_second_session_in_one_process_counts_from_the_first_ones_end(snap, tmp_path, fresh):
    first = _recorded(snap, tmp_path / "a.memtrace").facts[F.SELF_COST]
    second = _recorded(snap, tmp_path / "b.memtrace").facts[F.SELF_COST]
    assert second["sources"]["phases"]["calls"] == first["sources"]["phases"]["calls"] == 8


def test_the_history_estimate_counts_allocations_and_their_depth():
    trace = load_trace(FULL)
    allocs = trace.events[trace.events["action"] == ACTION_CODE["alloc"]]
    depth = [len(trace.stacks[i]) if i >= 0 else 0 for i in allocs["stack"]]
    base = {"measured": True, "per_alloc_ns": 1000.0, "per_frame_ns": 0.0, "depth": 0}
    assert history_estimate_ns(trace.events, trace.stacks, base) == 1000 * len(allocs)
    deeper = {**base, "per_frame_ns": 10.0, "depth": 5}
    assert history_estimate_ns(trace.events, trace.stacks, deeper) == 1000 * len(allocs) + 10 * sum(
        max(d - 5, 0) for d in depth
    )
    assert history_estimate_ns(trace.events, trace.stacks, {"measured": False, "why": "no GPU"}) is None


def test_an_old_trace_says_its_cost_was_not_recorded():
    trace = load_trace(FULL)
    assert not self_cost(trace).recorded
    out = io.StringIO()
    render_report(summarize(trace), out)
    assert "memtrace on the program's threads: not recorded" in out.getvalue()


def test_the_report_states_the_cost_and_its_share_of_init_engine_and_of_the_process_start_up(snap, tmp_path, fresh):
    trace = _recorded(snap, tmp_path / "t.memtrace")
    trace.facts[F.SELF_COST]["history"] = {"measured": True, "per_alloc_ns": 2000.0, "per_frame_ns": 0.0, "depth": 0}
    t0 = trace.phases[1].start_us
    trace.phases[1].name = "determine_available_memory"  # the worker's init engine starts here
    trace.facts[F.VLLM_STARTUP_COMPLETE_US] = t0 + 10_000_000  # 10 s of init engine
    trace.facts[F.PROCESS_START_US] = t0 - 30_000_000  # the process started 30 s before it: 40 s in all
    cost = self_cost(trace)
    allocs = int((trace.events["action"] == ACTION_CODE["alloc"]).sum())
    assert cost.history_ns == 2000 * allocs
    assert cost.total_ns == trace.facts[F.SELF_COST]["total_ns"] + 2000 * allocs
    assert cost.init_engine_us == 10_000_000
    assert cost.share_of_init_engine == pytest.approx(cost.total_ns / 1e10)
    assert cost.process_startup_us == 40_000_000
    assert cost.share_of_process_startup == pytest.approx(cost.total_ns / 4e10)
    assert cost.sources[0].ns == max(s.ns for s in cost.sources)
    line = cost_text.headline(cost, vllm=True)
    assert line == (
        f"memtrace on vLLM's threads: {cost.total_ns / 1e6:.1f} ms ({cost.total_ns / 1e8:.2f} % of init engine, "
        f"10.00 s; {cost.total_ns / 4e8:.2f} % of the process's start-up, 40.00 s)"
    )
    del trace.facts[F.PROCESS_START_US]  # a trace recorded before the fact: init engine only
    line = cost_text.headline(self_cost(trace), vllm=True)
    assert line.endswith(f"({cost.total_ns / 1e8:.2f} % of init engine, 10.00 s)")
    assert f"{HISTORY} {2000 * allocs / 1e6:.1f} ms" in cost_text.sources(cost)


def test_without_a_gpu_the_history_cost_is_not_measured_never_zero(snap, tmp_path, fresh):
    trace = _recorded(snap, tmp_path / "t.memtrace")
    trace.facts[F.SELF_COST]["history"] = history_cost.not_measured("no CUDA device is visible to torch")
    cost = self_cost(trace)
    assert cost.history_ns is None and HISTORY not in [s.name for s in cost.sources]
    assert "the allocator history's own cost not measured" in cost_text.headline(cost, vllm=True)
    assert cost_text.sources(cost).endswith("allocator history not measured: no CUDA device is visible to torch")


class SlowHistoryTorch:
    """torch.empty on a virtual clock: 500 ns an allocation, and while the history records 2,000 ns more
    plus 100 ns a Python frame of the caller's stack."""

    uint8 = "uint8"

    def __init__(self):
        self.on = False
        self.now = 0
        self.reserved = 0
        self.emptied = 0
        outer = self

        class cuda:
            @staticmethod
            def memory_reserved(device):
                return outer.reserved

            @staticmethod
            def empty_cache():
                outer.emptied += 1
                outer.reserved = 0

        self.cuda = cuda
        self.time = types.SimpleNamespace(perf_counter_ns=lambda: outer.now)

    def empty(self, n, dtype, device):
        self.reserved = 2 << 20  # the first block makes the allocator reserve a segment
        self.now += 500
        if self.on:
            frame, depth = sys._getframe(1), 0  # the caller's frames, as torch records them
            while frame is not None:
                depth += 1
                frame = frame.f_back
            self.now += 2000 + 100 * depth
        return object()


def test_the_calibration_measures_a_cost_per_allocation_and_per_frame(monkeypatch):
    torch = SlowHistoryTorch()
    monkeypatch.setattr(history_cost, "time", torch.time)
    got = history_cost.calibrate(torch, 0, lambda: setattr(torch, "on", True), lambda: setattr(torch, "on", False))
    assert got["measured"] is True and got["released_segment"] is True and torch.emptied == 1
    assert got["per_frame_ns"] == 100.0
    assert got["per_alloc_ns"] == 2000 + 100 * got["depth"]


def test_hooks_applied_when_a_watched_module_is_imported_are_charged_to_patching(fresh, tmp_path, monkeypatch):
    (tmp_path / "selfcost_late.py").write_text("def work():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    class Handler:
        key = "late"

        def before(self, target, args, kwargs):
            return None

        def after(self, token, result, error):
            pass

    manager = HookManager()
    try:
        manager.add("selfcost_late:work", Handler())
        assert "patching" not in selfcost.totals()["sources"]  # nothing to patch before the import
        import selfcost_late

        assert selfcost_late.work() == 1 and selfcost_late.work.__wrapped__ is not None  # patched on import
    finally:
        manager.unpatch()
        sys.modules.pop("selfcost_late", None)
    patching = selfcost.totals()["sources"]["patching"]
    assert patching["calls"] == 1 and patching["ns"] > 0
