"""Issue 41 item 11: the words of the outputs, on shipped traces: counts agree with their nouns and carry
thousands separators, a setting without a value says it is unset, a cost charged without a call says why, the
target's source reads as a sentence."""

from __future__ import annotations

from pathlib import Path

import pytest
from memtrace.cli import main
from memtrace.units import count_of, thousands

DATA = Path(__file__).resolve().parents[1] / "data"


def _report(capsys, run: Path) -> str:
    assert main(["report", str(run)]) == 0
    return " ".join(capsys.readouterr().out.split())


def test_a_count_agrees_with_its_noun_and_has_thousands_separators():
    assert count_of(1, "block") == "1 block" and count_of(13_587, "block") == "13,587 blocks"
    assert count_of(0, "request") == "0 requests" and count_of(None, "token") == "- tokens"
    assert count_of(1, "process", "processes") == "1 process" and count_of(2, "process", "processes") == "2 processes"
    assert thousands(260_474) == "260,474" and thousands(None) == "-"


def test_the_serving_window_counts_carry_separators_and_a_cost_without_calls_says_why(capsys):
    out = _report(capsys, DATA / "vllm-h200-034-serving" / "oom")
    assert "kept 260,474 allocator events, 149 NVML samples, 514 scheduler steps; ring bound 1,000,000 events" in out
    out = _report(capsys, DATA / "vllm-h100-034-serving" / "oom-held")
    assert "hooks.phases 5.2 ms (0: the ends of calls begun earlier)" in out
    assert "(0)" not in out


def test_the_allocator_settings_say_an_unset_variable_is_unset_and_the_target_source_is_a_sentence(capsys):
    out = _report(capsys, DATA / "vllm-h200-034" / "moe-ext")
    assert "allocator settings: PYTORCH_CUDA_ALLOC_CONF unset, expandable_segments:False," in out
    assert "PYTORCH_CUDA_ALLOC_CONF," not in out
    assert "from: the recorded --gpu-memory-utilization 1, vLLM's default with the extensible KV cache" in out


@pytest.mark.parametrize("run", ["h200/startup-cap6g"])
def test_history_counts_one_process_in_the_singular(run, tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    assert main(["history", "add", str(DATA / run), "--db", str(db)]) == 0
    assert "added run #1 (1 process) to" in capsys.readouterr().out
    assert main(["history", "accept", "1", "--db", str(db)]) == 0
    assert capsys.readouterr().out.startswith("run #1 (1 process) is now the accepted reference")
