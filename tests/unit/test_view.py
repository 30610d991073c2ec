"""`memtrace view` without a browser: the page is self-contained, follows the output policy, and the
data it carries rebuilds the report's figures exactly (the browser tests in tests/browser check the
page's own code does the same in Chromium). Real data: the vLLM 0.25.1 start-up recorded on the H200.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import io
import json
import re
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from memtrace import load
from memtrace.analysis.holders.view_window import RankQueries
from memtrace.cli import main
from memtrace.cli._serve import start
from memtrace.plots.view_data import pack_rank
from testdata import DATA, TESTS, analysed_rank, analysed_run, real_traces, unpacked

STARTUP = unpacked(DATA / "vllm-h200" / "startup")


def _analysis(run: Path = STARTUP):
    trace = load(run).traces[0]
    return analysed_rank(trace)


def _decode(packed) -> dict[str, np.ndarray]:
    raw = gzip.decompress(packed.blob)
    return {
        c["name"]: np.frombuffer(raw, dtype=np.dtype(c["dtype"]), count=c["length"], offset=c["offset"])
        for c in packed.columns
    }


def test_view_writes_one_self_contained_page_named_after_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["view", str(STARTUP)]) == 0
    page = (tmp_path / "startup-view.html").read_text()
    assert "wrote startup-view.html" in capsys.readouterr().err
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)["']""", page)
    assert refs == ["data:,"]  # only the empty favicon: no script, style or image comes from elsewhere
    assert "https://cdn" not in page and '<link rel="stylesheet"' not in page
    assert page.count("fetch(") == 1 and "fetch(path)" in page  # only the served page's /api/ calls
    doc = json.loads(re.search(r'<script type="application/json" id="mt-doc">(.*?)</script>', page, re.S)[1])
    assert doc["api"] is False and doc["ranks"][0]["label"] == "rank 0"
    assert "Reconciliation" in doc["report"]  # the report as `memtrace report` prints it


def test_existing_page_needs_force_and_the_suffix_must_be_html(tmp_path, capsys):
    out = tmp_path / "v.html"
    out.write_text("keep")
    assert main(["view", str(STARTUP), "-o", str(out)]) == 2
    assert out.read_text() == "keep" and "--force" in capsys.readouterr().err
    assert main(["view", str(STARTUP), "-o", str(tmp_path / "v.png")]) == 2
    assert "html" in capsys.readouterr().err
    assert main(["view", str(STARTUP), "-o", str(out), "--rank", "3"]) == 2
    assert out.read_text() == "keep"
    assert main(["view", str(STARTUP), "-o", str(out), "--force"]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_packed_events_rebuild_the_curves_and_the_live_set_at_the_peak_to_the_byte():
    a = _analysis()
    packed = pack_rank(a, a.origin.t0_us)
    col = _decode(packed)
    n = packed.meta["n_events"]
    # the page's own arithmetic (assets/view.js buildLocal / liveLocal), in numpy
    times = packed.meta["first_event_us"] + np.cumsum(col["dt"].astype(np.int64))
    assert np.array_equal(times + packed.meta["t0_us"], a.curves.allocated.time_us[1:])
    sign = np.where(col["act"] == 0, 1, np.where(col["act"] == 2, -1, 0))
    allocated = packed.meta["baseline"]["allocated"] + np.cumsum(sign * col["size"].astype(np.int64))
    assert np.array_equal(allocated, a.curves.allocated.bytes[1:])
    e = a.peak.event_index
    i = np.arange(n)
    live = (col["act"] == 0) & (i <= e) & (i + col["life"] > e)
    total = int(col["size"][live].astype(np.int64).sum()) + int(col["pre_size"][col["pre_end"] > e].sum())
    assert total == a.peak.allocated_bytes == 137_882_827_252
    assert packed.meta["peak"]["allocated_bytes"] == total


def test_the_page_holds_at_most_24_bytes_per_event_on_the_bench_generator(tmp_path):
    sys.path.insert(0, str(TESTS / "bench"))
    from bench_store_report import build
    from memtrace.plots.view_html import build_page

    trace = build(200_000)
    page = build_page(analysed_run([trace]), title="bench", max_events=4_000_000, api=False)
    assert len(page.encode()) / len(trace.events) <= 24


def test_window_is_exact_when_zoomed_in_and_an_envelope_when_not():
    a = _analysis()
    q = RankQueries(a, a.origin.t0_us)
    whole = q.window(0, q.t[-1] / 1e6, 800)
    assert not whole["exact"] and whole["events"] == len(a.event_times)
    at = a.peak.state_us - q.t0
    near = q.window((at - 40) / 1e6, (at + 40) / 1e6, 800)
    assert near["exact"]
    x, top = near["data"][0], near["data"][1]  # the top of the stack is all allocated memory
    k = max(j for j, t in enumerate(x) if t * 1e6 <= at + 0.4)
    assert top[k] == a.peak.allocated_bytes
    assert max(whole["data"][1]) == a.curves.allocated.peak_bytes  # the envelope keeps the maximum


def test_server_listens_on_loopback_and_answers_the_page_queries():
    a = _analysis()
    server = start(analysed_run([a.trace]), title="t", max_events=1_000)
    try:
        assert server.server_address[0] == "127.0.0.1"
        get = lambda path: urllib.request.urlopen(server.url + path, timeout=10).read()  # noqa: E731
        assert b'"api":true' in get("")
        e = json.loads(get(f"api/event?rank=0&t_us={a.peak.state_us - server.queries[0].t0}"))["event"]
        assert e == a.peak.event_index
        live = json.loads(get(f"api/live?rank=0&event={e}"))
        assert live["total"] == a.peak.allocated_bytes
        assert sum(g["bytes"] for g in live["groups"]) == live["total"]
        for bad, code in (("api/live?rank=0&event=99999999", 400), ("api/live?rank=7&event=1", 400), ("nope", 404)):
            with pytest.raises(urllib.error.HTTPError) as err:
                get(bad)
            assert err.value.code == code
    finally:
        server.shutdown()
        server.server_close()


def test_a_run_over_max_events_carries_an_overview_instead_of_its_events(tmp_path):
    out = tmp_path / "o.html"
    with contextlib.redirect_stderr(io.StringIO()):
        assert main(["view", str(STARTUP), "-o", str(out), "--max-events", "1000"]) == 0
    page = out.read_text()
    doc = json.loads(re.search(r'id="mt-doc">(.*?)</script>', page, re.S)[1])
    rank = doc["ranks"][0]
    assert rank["has_events"] is False and not rank["overview"]["exact"]
    assert [c["name"] for c in rank["columns"]] == ["dev_t", "dev_used", "dev_nontorch"]
    blob = re.search(r'id="mt-blob-0">(.*?)</script>', page, re.S)[1]
    assert len(base64.b64decode(blob)) < 100_000


def test_view_serve_prints_a_loopback_address_and_stops_on_ctrl_c():
    import signal
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-m", "memtrace", "view", "--serve", str(STARTUP)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = ""
        while "serving" not in line:
            line = proc.stderr.readline()
            assert line, "the server never said where it listens"
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)[0]
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.read().startswith(b"<!DOCTYPE html>")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()


def test_the_page_carries_the_report_as_memtrace_report_prints_it(tmp_path):
    out = tmp_path / "v.html"
    with contextlib.redirect_stderr(io.StringIO()):
        assert main(["view", str(STARTUP), "-o", str(out), "--util", "0.85"]) == 0
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["report", str(STARTUP), "--util", "0.85"]) == 0
    doc = json.loads(re.search(r'id="mt-doc">(.*?)</script>', out.read_text(), re.S)[1])
    assert doc["report"] == buf.getvalue()
    assert doc["ranks"][0]["target"]["bytes"] == 127_593_398_272  # ceil(0.85 x the H200's 150,109,880,320 B)


@pytest.mark.parametrize("path", real_traces(), ids=lambda p: p.parent.name)
def test_live_set_groups_are_the_flame_graphs_paths_at_the_peak(path):
    """Hook frames ([hook] ...), stacks and the phase of stack-less allocations, as `memtrace flame` draws them."""
    from memtrace.analysis.holders.flame import flame_at

    a = _analysis(path)
    q = RankQueries(a, a.origin.t0_us)
    e = a.peak.event_index
    live = q.live(e, top=10_000)
    assert {tuple(g["path"]): g["bytes"] for g in live["groups"]} == flame_at(a.trace, event_index=e).stacks
    assert live["total"] == a.peak.allocated_bytes


def test_a_bad_run_is_one_line_and_writes_nothing(tmp_path, capsys):
    junk = tmp_path / "junk.memtrace"
    junk.write_bytes(b"not a trace")
    for run in (tmp_path / "missing", junk):
        assert main(["view", str(run), "-o", str(tmp_path / "v.html")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("memtrace: error:") and "\n" not in err
    assert not (tmp_path / "v.html").exists()
    same = tmp_path / "run.html"
    same.write_bytes(b"not a trace")
    assert main(["view", str(same), "-o", str(same), "--force"]) == 2  # an input is never an output
    assert same.read_bytes() == b"not a trace" and "input" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--serve", "--port", "70000"], ["--max-events", "-1"], ["--util", "2"]])
def test_bad_flags_are_one_line(flags, capsys):
    assert main(["view", str(STARTUP), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memtrace: error:") and "\n" not in err


def _page_doc(run: Path, tmp: Path, capsys) -> dict:
    out = tmp / "v.html"
    assert main(["view", str(run), "-o", str(out), "--force"]) == 0
    capsys.readouterr()
    return json.loads(re.search(r'id="mt-doc">(.*?)</script>', out.read_text(), re.S)[1])


def test_the_first_crossing_landmark_states_the_reports_curve_value_and_phases(tmp_path, capsys):
    # issue 21: on the real vLLM start-up the page's "first crossing" read out what was live (113.48 GiB of PyTorch
    # allocations, kv_cache_init) where the report says NVML device used crossed at 128.92 GiB and went highest in
    # compile_or_warm_up/kernel_warmup; the landmark now carries the report's figures, and the page states them
    run = STARTUP
    assert main(["report", str(run), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["traces"][0]["crossings"][0]
    rank = _page_doc(run, tmp_path, capsys)["ranks"][0]
    (lm,) = [m for m in rank["landmarks"] if m["name"].startswith("first crossing")]
    assert lm["name"] == "first crossing (device used)" and first["curve"] == "device_used"
    assert (lm["time_us"], lm["bytes"], lm["phase"]) == (first["time_us"], first["at_cross_bytes"], first["phase_path"])
    assert (lm["max_bytes"], lm["max_phase"]) == (first["max_bytes"], first["max_phase_path"])
    assert f"{lm['bytes'] / 2**30:.2f}" == "128.92"
    assert rank["crossings"][0]["curve"] == "device_used"  # the crossing line the chart draws: crossings[0]
    ui = (Path(__file__).resolve().parents[2] / "plots" / "assets" / "view_ui.js").read_text()
    assert "m.crossings[0]" in ui and "b.time_us < a.time_us" not in ui  # not the earliest curve's
    assert "landmarkLine(m, lm)" in ui and "NVML device used" in ui


def test_the_pages_title_names_what_ran_as_the_timelines_does_not_the_folder(tmp_path, capsys):
    # issue 21: the page was titled by the folder ("GPU memory during start-up: run") where the PNG names the model
    run = tmp_path / "run"
    shutil.copytree(STARTUP, run)
    doc = _page_doc(run, tmp_path, capsys)
    assert main(["plot", str(run), "-o", str(tmp_path / "t.svg")]) == 0
    capsys.readouterr()
    svg = (tmp_path / "t.svg").read_text()
    assert doc["title"] == "GPU memory during start-up: Qwen3MoeForCausalLM, vLLM 0.25.1, NVIDIA H200"
    assert doc["title"].split(": ", 1)[1] in svg and ": run" not in doc["title"]


def test_the_page_draws_categories_in_the_timelines_colours(tmp_path, capsys):
    # issue 21: the page had a palette of its own
    from memtrace.analysis.memory.categories import CATEGORIES
    from memtrace.plots.timeline_axes import COLORS

    rank = _page_doc(STARTUP, tmp_path, capsys)["ranks"][0]
    assert rank["category_colors"] == [COLORS[c] for c in CATEGORIES]
    ui = (Path(__file__).resolve().parents[2] / "plots" / "assets" / "view_ui.js").read_text()
    fallback = re.search(r"category_colors\) \|\| (\[[^\]]*\])", ui)[1]
    assert json.loads(fallback.replace("'", '"')) == rank["category_colors"]
    assert "'#4e79a7'" not in ui  # the old palette is gone
