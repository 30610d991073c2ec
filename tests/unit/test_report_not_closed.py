"""A memtrace trace that memtrace never closed (its process SIGKILLed while it wrote, as happened to one of
the H200 cost runs of 2026-12-03) says so in the report instead of saying nothing about how it ended."""

import dataclasses
import io

from memtrace.plots.text import render_report
from memtrace.store import load_trace
from references import summarize

from tests.testdata import DATA, unpacked


def _recording_line(trace) -> str:
    buf = io.StringIO()
    render_report(summarize(trace), buf)
    return " ".join(buf.getvalue().split()).split("recording: ", 1)[1].split(" file: ", 1)[0]


def test_a_trace_memtrace_did_not_close_says_so():
    closed = load_trace(unpacked(DATA / "vllm-h200" / "startup-cupti" / "vm-pid1909-rank0.memtrace"))
    assert closed.recording.source == "memtrace" and closed.recording.end_reason == "startup-complete"
    assert "ended: startup-complete" in _recording_line(closed)
    killed = dataclasses.replace(closed, recording=dataclasses.replace(closed.recording, end_reason=""))
    line = _recording_line(killed)
    assert "not closed: still recording, or the process was killed before memtrace closed the trace" in line
    assert "ended:" not in line
