"""The pytest plugin: @pytest.mark.memtrace(max_peak=...) and the memtrace_budget fixture.

This machine has no GPU: the skip path runs for real (pytester, the plugin loaded by its pytest11
entry point); the over-budget verdict is the pure ``check_budget`` over recorded traces (synthetic
start-ups, named so, and real H200 traces when they exist); the failure report inside pytest is
exercised once with a FAKE recorder standing in for the GPU recording, named so.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import synthetic_gates as g
from memtrace.analysis.gate.budget import check_budget
from memtrace.errors import UsageError
from memtrace.plugins.pytest_plugin import cuda_unavailable_reason, failure_message, parse_budget
from memtrace.store import load_trace

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parents[1]
GiB, MiB = g.GiB, g.MiB
H200 = TESTS / "data" / "h200"
NO_CUDA = cuda_unavailable_reason()


# -- the pure check -------------------------------------------------------------------------------


def test_budget_over_the_peak_names_phase_and_holders():
    trace = g.vllm_like_startup(extra_workspace=GiB)
    result = check_budget(trace, 30 * GiB)
    # the reserved peak: weights 20 GiB + workspaces 3 GiB + KV cache + warm-up, in warm-up
    assert result.over
    assert result.phase == "compile_or_warm_up/capture_model"
    assert result.excess_bytes == result.peak_bytes - 30 * GiB
    names = [h.frame.name for h in result.holders]
    assert names[0] == "create_weights" and "allocate_extra_workspace" in names
    msg = failure_message(result, "test_x", "30GiB", "/tmp/t.memtrace")
    assert msg.splitlines()[0].startswith("test_x: GPU memory peak ")
    assert "over the budget 30GiB (30.00 GiB)" in msg
    assert "peak in phase: compile_or_warm_up/capture_model" in msg
    assert "create_weights (layers/linear.py:301)" in msg


def test_budget_above_the_peak_passes():
    trace = g.vllm_like_startup()
    assert not check_budget(trace, 64 * GiB).over


def test_allocated_and_device_curves_can_be_budgeted():
    trace = g.vllm_like_startup()
    res, alloc, dev = (check_budget(trace, 64 * GiB, curve=c) for c in ("reserved", "allocated", "device"))
    assert alloc.peak_bytes <= res.peak_bytes < dev.peak_bytes
    assert dev.peak_bytes - res.peak_bytes == g.NON_TORCH


def test_budget_on_real_h200_traces_names_the_peak_phase():
    traces = sorted(H200.glob("startup-*/*.memtrace")) if H200.exists() else []
    if not traces:
        pytest.skip("no real H200 traces under tests/data/h200 yet")
    for path in traces[:3]:
        trace = load_trace(path)
        result = check_budget(trace, 1 * GiB)
        assert result.over and result.phase  # every real start-up is far above 1 GiB, in a named phase
        assert sum(h.bytes for h in result.holders) <= result.peak_bytes


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "give max_peak"),
        ({"max_peak": "lots"}, "cannot read size 'lots'"),
        ({"max_peak": "1GiB", "curve": "nvml"}, "unknown curve 'nvml'"),
        ({"max_peak": "1GiB", "limit": 3}, "unknown argument(s) limit"),
        ({"max_peak": "1GiB", "util": 0.5}, "either max_peak or util"),
        ({"max_peak": "1GiB", "total": "80GiB"}, "total= only applies with util="),
        ({"util": 0}, "fraction 0 must be above 0"),
    ],
)
def test_bad_budget_arguments_are_one_line_errors(kwargs, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_budget(**kwargs)


def test_budget_sizes_parse():
    assert parse_budget("30GiB").max_peak_bytes == 30 * GiB
    assert parse_budget(max_peak="512MiB", curve="allocated") == parse_budget(512 * MiB, "allocated").__class__(
        512 * MiB, "512MiB", "allocated"
    )


def test_util_budget_parses():
    b = parse_budget(util="90%", total="80GiB")
    assert (b.max_peak_bytes, b.util, b.total_bytes, b.max_peak_text) == (None, 0.9, 80 * GiB, "util 0.9")


# -- the same target and figures as `memtrace report` (issue 10: one answer everywhere) ---------------------


def test_util_budget_is_the_target_report_resolves_and_the_peaks_are_reports():
    from memtrace.analysis.memory.target import resolve_target
    from references import summarize

    trace = load_trace(next((H200 / "startup-cap32g").glob("*.memtrace")))
    result = check_budget(trace, util=0.5)
    # the card this run stood for is 32 GiB (capacity_bytes), not the H200's 139.8 GiB
    assert result.budget_bytes == resolve_target(trace, util=0.5).target_bytes == 16 * GiB
    assert result.budget_source == "--util 0.5 x the card"
    s = summarize(trace)
    assert (result.peak_bytes, result.peak_us, result.phase) == (
        s.peak.reserved_bytes,
        s.peak.time_us,
        s.peak.phase_path,
    )
    assert result.peaks == {
        "reserved": s.peak.reserved_bytes,
        "allocated": s.peak_allocated.bytes,
        "device": s.peak_device_used.bytes,
    }
    assert [h.bytes for h in result.holders] == [h.bytes for h in s.holders[:5]]
    dev = check_budget(trace, util=0.5, curve="device")
    assert (dev.peak_bytes, dev.phase) == (s.peak_device_used.bytes, s.peak_device_used.phase_path)
    assert result.oom is None


def test_a_budget_names_the_oom_the_run_died_of():
    trace = load_trace(next((H200 / "startup-cap16g").glob("*.memtrace")))
    result = check_budget(trace, 8 * GiB)
    assert result.oom.phase_path == "compile_or_warm_up/kernel_warmup" and result.oom.requested_bytes == GiB
    msg = failure_message(result, "test_x", "8GiB")
    assert "  died of CUDA OOM in compile_or_warm_up/kernel_warmup: asked for 1.00 GiB" in msg
    assert "  peaks (as memtrace report): reserved 14.40 GiB, allocated 14.32 GiB, device " in msg


def test_no_budget_at_all_is_one_line():
    with pytest.raises(UsageError, match="no memory budget"):
        check_budget(dataclasses.replace(g.vllm_like_startup(), facts={}))  # no max_peak, no util, no recorded target


# -- inside pytest (pytester) ---------------------------------------------------------------------


@pytest.mark.skipif(NO_CUDA is None, reason="this machine has a CUDA GPU: the skip path does not apply")
def test_marked_test_is_skipped_with_the_reason_without_cuda(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.memtrace(max_peak="1GiB")
        def test_uses_gpu():
            raise AssertionError("must not run without a GPU")

        def test_fixture(memtrace_budget):
            with memtrace_budget("1GiB"):
                raise AssertionError("must not run without a GPU")
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*SKIPPED*memtrace budget needs a CUDA GPU*"])


def test_bad_marker_fails_even_without_a_gpu(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.memtrace(max_peak="thirty gigs")
        def test_typo():
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)  # reported at set-up, before any GPU check
    result.stdout.fnmatch_lines(["*cannot read size 'thirty gigs'*"])


def test_marker_is_registered(pytester):
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.memtrace(max_peak, curve='reserved', util=None, total=None): fail*"])


def test_over_budget_test_fails_with_a_readable_report_FAKE_recorder(pytester, tmp_path):
    # FAKE: this machine has no GPU, so a conftest replaces the CUDA check and the recording with a
    # recorder that returns a synthetic start-up's trace; the verdict and the report are the real ones.
    trace_path = tmp_path / "synthetic.memtrace"
    from memtrace.store import save_trace

    save_trace(g.vllm_like_startup(extra_workspace=GiB), trace_path)
    pytester.makeconftest(
        f"""
        import contextlib
        from pathlib import Path
        import memtrace.plugins.pytest_plugin as plugin

        plugin.cuda_unavailable_reason = lambda: None

        @contextlib.contextmanager
        def fake_record(config, nodeid, phase_name):
            try:
                yield {{"path": Path({str(trace_path)!r})}}
            finally:  # every recording is stopped, whether the test passed or raised
                with open({str(tmp_path / "stopped.txt")!r}, "a") as f:
                    f.write(nodeid + "\\n")

        plugin._record = fake_record
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.memtrace(max_peak="30GiB")
        def test_too_big():
            pass

        @pytest.mark.memtrace(max_peak="64GiB")
        def test_fits():
            pass

        @pytest.mark.memtrace(max_peak="30GiB")
        def test_raises():
            raise ValueError("its own failure")
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*ValueError: its own failure*"])  # not replaced by the budget verdict
    assert len((tmp_path / "stopped.txt").read_text().splitlines()) == 3
    result.stdout.fnmatch_lines(
        [
            "*test_too_big: GPU memory peak * (reserved) is over the budget 30GiB (30.00 GiB) by *",
            "*peak in phase: compile_or_warm_up/capture_model*",
            "*top holders at the peak:*",
            "*create_weights (layers/linear.py:301)*",
        ]
    )


def test_loading_the_plugin_imports_no_torch_or_numpy(pytester):
    pytester.makepyfile(
        """
        import sys

        def test_plain():
            heavy = [m for m in ("torch", "numpy", "matplotlib", "vllm") if m in sys.modules]
            assert heavy == [], heavy
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_plugin_is_registered_by_its_entry_point():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlib.metadata import entry_points; "
            "print([e.value for e in entry_points(group='pytest11') if e.name == 'memtrace'])",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        check=True,
        cwd="/",  # a stale memtrace.egg-info in the repository root would shadow the installed metadata
    )
    assert out.stdout.strip() == "['memtrace.plugins.pytest_plugin']"


def test_a_budgeted_test_that_died_of_oom_reports_where_FAKE_recorder(pytester):
    # FAKE recorder as above, returning the real H200 trace of a start-up that died of OOM on a 16 GiB card
    trace_path = next((H200 / "startup-cap16g").glob("*.memtrace"))
    pytester.makeconftest(
        f"""
        import contextlib
        from pathlib import Path
        import memtrace.plugins.pytest_plugin as plugin

        plugin.cuda_unavailable_reason = lambda: None

        @contextlib.contextmanager
        def fake_record(config, nodeid, phase_name):
            yield {{"path": Path({str(trace_path)!r})}}

        plugin._record = fake_record
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.memtrace(max_peak="64GiB")
        def test_dies():
            raise MemoryError("CUDA out of memory. Tried to allocate 1024.00 MiB")
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*MemoryError: CUDA out of memory*",
            "*- memtrace -*",
            "GPU memory peak 14.40 GiB (reserved) in compile_or_warm_up/kernel_warmup",
            "  died of CUDA OOM in compile_or_warm_up/kernel_warmup: asked for 1.00 GiB with *",
        ]
    )
