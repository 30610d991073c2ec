"""flame's lines say a time at which ``--at`` shows the very bytes they print (issue 41, item 6): a peak at
7.050455 s is not said as 7.050 s when ``--at 7.050`` shows 0.25 GiB less, and the held peak's hint names the
bytes ``--at`` shows (live), not the held figure (reserved + committed): on a vLLM 0.34 run the default flame is at
the run's headline peak (held), so its own line says what ``--at`` shows there."""

from __future__ import annotations

import io
import re

from memtrace.analysis.holders.moment import flame_for, seconds_text
from memtrace.plots.flame_svg import say_flame
from memtrace.store import load_run
from memtrace.units import format_bytes

from tests.testdata import DATA, analysed_rank, unpacked_dir


def _said(rank) -> str:
    moment, flame = flame_for(rank, "peak")
    log = io.StringIO()
    say_flame(rank, moment, flame, log)
    return log.getvalue()


def _shown_at(rank, secs: str) -> str:
    return format_bytes(flame_for(rank, secs)[1].total_bytes, 2)


def test_the_peak_lines_time_shows_the_peak_lines_bytes():
    for rank in (
        analysed_rank(load_run(DATA / "h200" / "startup-cap16g").traces[0]),
        analysed_rank(load_run(unpacked_dir("vllm-h200-034/moe-ext")).traces[0]),
    ):
        m = re.search(r": ([\d.]+ [GMK]iB) .*live at the (?:reserved peak|peak held .*\)) \(([\d.]+) s\)", _said(rank))
        assert m is not None
        assert _shown_at(rank, m.group(2)) == m.group(1), m.group(0)
    assert "(7.0505 s)" in _said(analysed_rank(load_run(DATA / "h200" / "startup-cap16g").traces[0]))


def test_the_default_flame_of_a_vmm_run_is_at_the_held_peak_and_its_time_shows_its_bytes():
    rank = analysed_rank(load_run(unpacked_dir("vllm-h200-034/moe-ext")).traces[0])
    said = _said(rank)
    m = re.search(
        r": ([\d.]+ GiB) \(PyTorch 11.06 GiB \+ KV cache 126.23 GiB .*\) live at the peak held .*\(([\d.]+) s\)", said
    )
    assert m is not None, said
    assert m.group(2) == "179.244" and m.group(1) == _shown_at(rank, m.group(2)) == "137.29 GiB"


def test_a_time_the_user_gave_is_said_as_precisely_as_given():
    assert [seconds_text(us) for us in (7_050_500, 7_050_000, 7_000_000, 168_969_283)] == [
        "7.0505", "7.050", "7.000", "168.969283"]  # fmt: skip
