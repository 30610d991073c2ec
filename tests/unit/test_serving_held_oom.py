"""A real serving OOM written from PyTorch's own history ring (tests/data/vllm-h100-034-serving/oom-held, issue 30):
vLLM 0.34.0 ``vllm serve`` under ``memtrace run --until serving`` with serving's default, the held ring, on an H100
left 24 GiB by a holder; after start-up a neighbour took all but 256 MiB of what was free, then a burst of requests.
Every figure asserted is read from torch's own message in vLLM's log, or from what the held ring must have kept."""

from __future__ import annotations

import pytest
from memtrace.cli import main
from memtrace.model import ACTION_CODE
from memtrace.store import load_run
from vllm034_data import Recorded

HELD = Recorded("vllm-h100-034-serving")


@pytest.fixture(scope="module")
def run_dir():
    return HELD.run_dir("oom-held")


def torch_says(what: str) -> str:
    return HELD.torch_says("oom-held", what)


def test_the_held_rings_window_names_torchs_failed_request_to_the_byte(run_dir, capsys):
    assert main(["report", str(run_dir)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (torch_says("requested"), torch_says("free"), torch_says("allowed")) == (
        "22.00 MiB",
        "17.00 MiB",
        "12.25 GiB",
    )
    assert (
        "DIED: CUDA out of memory at 18.07 s in serving: requested 22.00 MiB (23,068,672 B), device free "
        "17.00 MiB (17,825,792 B), allocator limit 12.25 GiB (13,153,992,704 B)"
    ) in text
    assert f"PyTorch reserved, unallocated {torch_says('reserved unallocated')}" in text  # 30.35 MiB
    assert f"PyTorch private pools, cached {torch_says('private pools')}" in text  # 2.00 MiB
    assert "the events held in PyTorch's own history ring (at most 200,000 entries" in text
    assert "memtrace while serving: " in text and "drain.window" in text


def test_the_held_ring_kept_every_event_of_the_window_but_the_free_requests(run_dir):
    t = load_run(run_dir).traces[0]
    w = t.window
    assert w.reason == "oom" and w.bounds["events_in"] == "torch" and w.bounds["stacks"] == "python"
    assert w.events_dropped == 0 and w.gap_us == 0 and w.events_kept == len(w.events) == 173_660
    assert not (w.events["action"] == ACTION_CODE["free_requested"]).any()  # skipped while held
    # every allocation the allocator counted while serving is in the ring (nothing was overwritten)
    assert w.cost["allocs"] == int((w.events["action"] == ACTION_CODE["alloc"]).sum()) == 86_829
    assert w.steps_in_progress[0]["tokens"] == 5553  # the step the OOM happened in
