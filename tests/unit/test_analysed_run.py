"""The analysed run itself (issue 21): each figure computed once, on the object; nothing cached elsewhere;
the trace left as it was loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from memtrace.analysis.analysed.rank import TargetSpec
from memtrace.analysis.analysed.run import analyse
from memtrace.analysis.analysed.summary import summary_doc
from memtrace.store import load_trace

TRACE = next((Path(__file__).resolve().parents[1] / "data" / "h200" / "startup-cap16g").glob("*.memtrace"))


def test_each_figure_is_computed_once_on_the_rank_and_shared():
    rank = analyse([load_trace(TRACE)]).ranks[0]
    for name in ("curves", "lifetimes", "categorized", "category_steps", "oom", "crossings", "holders", "landmarks"):
        assert getattr(rank, name) is getattr(rank, name), name
    assert summary_doc(rank)["target"]["target_bytes"] == rank.target.target_bytes  # the JSON reads the rank
    assert rank.fits([16 << 30]) is rank.fits([16 << 30])


def test_analysing_leaves_the_trace_as_it_was_loaded_and_keeps_no_process_wide_cache():
    import memtrace.analysis as analysis

    trace = load_trace(TRACE)
    rank = analyse([trace]).ranks[0]
    summary_doc(rank), rank.categorized  # noqa: B018
    assert trace.events.flags.writeable and trace.samples.flags.writeable  # main made them read-only
    assert not (Path(analysis.__file__).parent / "memo.py").exists()
    again = analyse([trace]).ranks[0]
    assert again.curves is not rank.curves  # a new run is analysed afresh: no hidden memo by id(trace)


def test_the_target_is_resolved_when_the_run_is_built_with_its_source():
    from memtrace.errors import UsageError

    rank = analyse([load_trace(TRACE)], TargetSpec(util=0.5)).ranks[0]
    assert (rank.target.source, summary_doc(rank)["target_source"]) == ("--util x card", "--util 0.5 x the card")
    with pytest.raises(UsageError):  # --util on a card the trace cannot give: refused before any output
        analyse([load_trace(TRACE)], TargetSpec(total_bytes=1 << 30))
