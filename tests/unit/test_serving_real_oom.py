"""The first real serving OOM (tests/data/vllm-h200-034-serving/oom, issue 30): vLLM 0.34.0 ``vllm serve`` under
``memtrace run --until serving`` on an H200 left 24 GiB by a holder process; after start-up a neighbour took all
but 256 MiB of what was free, then a burst of requests: torch raised OutOfMemoryError in serving. Every figure
asserted here is read from torch's own message in vLLM's log, or from the holder's and neighbour's logs."""

from __future__ import annotations

import re

import pytest
from memtrace.analysis.run import analyse
from memtrace.cli import main
from memtrace.store import load_run
from vllm034_data import Recorded

SERVING = Recorded("vllm-h200-034-serving")
MiB = 1 << 20


@pytest.fixture(scope="module")
def run_dir():
    return SERVING.run_dir("oom")


@pytest.fixture(scope="module")
def rank(run_dir):
    return analyse(load_run(run_dir).traces).ranks[0]


def torch_says(what: str) -> str:
    """A figure of torch's OutOfMemoryError in vLLM's log, as torch printed it ("22.00 MiB")."""
    size = r"([\d.]+ [KMG]iB)"
    patterns = {
        "requested": rf"OutOfMemoryError: CUDA out of memory\. Tried to allocate {size}",
        "free": rf"OutOfMemoryError: .* of which {size} is free",
        "allowed": rf"OutOfMemoryError: .* {size} allowed;",
        "allocated": rf"OutOfMemoryError: .* Of the allocated memory {size} is allocated by PyTorch",
        "private pools": rf"OutOfMemoryError: .* with {size} allocated in private pools",
        "reserved unallocated": rf"OutOfMemoryError: .* and {size} is reserved by PyTorch but unallocated",
        "this process": rf"OutOfMemoryError: .* this process has {size} memory in use",
        "holder": rf"OutOfMemoryError: .* Process 6185 has {size} memory in use",
        "neighbour": rf"OutOfMemoryError: .* Process 6770 has {size} memory in use",
    }
    return SERVING.logged("oom", patterns[what])


def _report(run_dir, capsys) -> str:
    assert main(["report", str(run_dir)]) == 0
    return capsys.readouterr().out


def _window_section(text: str) -> str:
    return text.split("\nServing window\n", 1)[1].split("\nDefinitions\n", 1)[0]


def test_the_windows_oom_is_torchs_failed_request_with_its_bytes_and_the_allocator_limit(run_dir, capsys):
    section = _window_section(_report(run_dir, capsys))
    assert torch_says("requested") == "22.00 MiB" and torch_says("free") == "19.94 MiB"
    assert torch_says("allowed") == "12.25 GiB"  # vLLM's cap on torch (set_per_process_memory_fraction)
    assert (
        "DIED: CUDA out of memory at 28.96 s in serving: requested 22.00 MiB (23,068,672 B), device free "
        "19.94 MiB (20,905,984 B), allocator limit 12.25 GiB (13,154,975,744 B)"
    ) in " ".join(section.split())
    assert "free of 12.25 GiB" not in section  # the limit is PyTorch's, not the device's total


def test_the_windows_oom_is_the_one_the_headline_names(rank):
    assert rank.window.oom == rank.oom  # analysis.oom.Oom, one answer for every output
    assert rank.window.oom.requested_bytes == 22 * MiB


def test_the_growth_table_reads_a_figure_too_small_for_gib_in_its_own_unit(run_dir, capsys):
    section = _window_section(_report(run_dir, capsys))
    table = section.split("allocated in the window, live at its end", 1)[1].split("\n\n", 1)[0]
    assert "0.000" not in table and " 0.00 " not in table
    assert re.search(r"torch/_ops\.py:1350 __call__ +68 B +1", table)
    assert re.search(r"kernels/vllm_c\.py:42 rms_norm +0\.07 +3", table)


def test_the_issue_bundle_and_the_view_word_the_failed_allocation_as_torch_does(rank, run_dir, tmp_path):
    from memtrace.plots.view_data import pack_rank

    assert main(["issue", str(run_dir), "-o", str(tmp_path / "bundle")]) == 0
    first_screen = "\n".join((tmp_path / "bundle" / "issue.md").read_text().splitlines()[:20])
    assert (
        "- **Failed allocation at 28.96 s in serving:** requested 22.00 MiB (23,068,672 B), device free 19.94 MiB "
        "(20,905,984 B), allocator limit 12.25 GiB (13,154,975,744 B)."
    ) in first_screen
    packed = pack_rank(rank, rank.origin.t0_us)
    assert packed.window.meta["oom"]["label"] == "OOM (requested 22.00 MiB)"
