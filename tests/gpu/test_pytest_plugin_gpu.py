"""The pytest plugin on a real GPU: a budgeted test is recorded and fails over budget, passes under it.

Run on the device machine: ``pytest -m gpu tests/gpu/test_pytest_plugin_gpu.py``.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

pytest_plugins = ["pytester"]

TESTS = """
import pytest
import torch

GiB = 1 << 30


@pytest.mark.memtrace(max_peak="1GiB")
def test_over_budget():
    x = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")  # 2 GiB live at the peak
    del x


@pytest.mark.memtrace(max_peak="3GiB")
def test_under_budget():
    x = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    del x


def test_block_over_budget(memtrace_budget):
    with memtrace_budget("512MiB", curve="allocated"):
        x = torch.empty(GiB, dtype=torch.uint8, device="cuda")
        del x


@pytest.mark.memtrace(max_peak="1GiB")
def test_never_touches_the_gpu():  # a job that lost its GPU work: nothing to judge, never a pass
    sum(range(1000))


@pytest.mark.memtrace(max_peak="1GiB")
def test_dies_of_oom():  # asks for far more than the card holds: the test's own error, memtrace's section
    torch.empty(4096 * GiB, dtype=torch.uint8, device="cuda")
"""


def test_budgets_are_enforced_on_a_real_gpu(pytester, tmp_path):
    pytester.makepyfile(TESTS)
    result = pytester.runpytest_subprocess("--memtrace-dir", str(tmp_path / "traces"))
    result.assert_outcomes(passed=1, failed=4)
    result.stdout.fnmatch_lines(
        [
            "*test_over_budget: GPU memory peak 2.00 GiB (reserved) is over the budget 1GiB (1.00 GiB) by 1.00 GiB*",
            "*peak in phase: test_over_budget*",
            "*test_over_budget (*test_budgets_are_enforced_on_a_real_gpu.py:*",
        ]
    )
    result.stdout.fnmatch_lines(
        ["*test_never_touches_the_gpu*recorded no allocator events, so there is nothing to judge against the budget*"]
    )
    result.stdout.fnmatch_lines(["*memtrace*", "*died of CUDA OOM in test_dies_of_oom: asked for *GiB*"])
    assert len(list((tmp_path / "traces").glob("*.memtrace"))) == 5
