"""The prices docs/serving.md and the serving data README quote (tests/bench/serving_cost_model.py), recomputed
from the shipped H200 serving OOM: PyTorch's recording of a decode step's allocations, and the drains the rounds'
default added to it."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "bench"))
import serving_cost_model  # noqa: E402

DOCS = TESTS.parent / "docs" / "serving.md"
README = TESTS / "data" / "vllm-h200-034-serving" / "README.md"


def test_the_quoted_prices_are_the_traces_own(capsys):
    assert serving_cost_model.main([]) == 0
    out = capsys.readouterr().out
    assert (
        "decode step (median of 511 of 514 steps): 10.00 ms, 468 allocator events (314 without free_requested), 160 allocations"
        in out
    )
    assert "1315 ns an allocation (calibration 1148 ns at depth 26 + 12.2 ns a frame; window's mean depth 39.7)" in out
    assert "held in PyTorch's ring (default): 0.210 ms a step = 2.10%" in out
    assert (
        "+ 3.23 µs an event (snapshot 1.86, convert 1.37; 2 drains of >= 50,000 events) = 1.514 ms a step; with the recording 17.25%"
        in out
    )
    for page in (DOCS.read_text(), README.read_text()):
        assert "0.210 ms" in page and "2.10 %" in page and "1.514 ms" in page and "17.25 %" in page


def test_a_trace_without_a_serving_window_is_one_clear_line(capsys):
    assert serving_cost_model.main([str(TESTS / "data" / "h200" / "startup-full")]) == 2
    assert "no serving window with scheduler steps" in capsys.readouterr().err
