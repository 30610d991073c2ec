"""`memtrace view` of a trace with CUPTI records: the page carries ``non_torch.live_curve`` as two
``cupti_*`` columns and its readout shows, at the moment under the cursor, the non-PyTorch bytes CUPTI
saw (exact) and the rest of NVML's non-PyTorch figure as unexplained. Real data: the vLLM start-up
recorded with CUPTI on the H200 (1,745 records); a trace without records carries no such columns and
shows no such rows. The browser part drives Debian's Chromium through Playwright (no browser download).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from memtrace import load
from memtrace.analysis.memory import non_torch
from memtrace.analysis.memory.curves import all_curves
from memtrace.plots.view_data import CUPTI_COLUMNS, DEVICE_COLUMNS, pack_rank
from testdata import DATA, analysed_rank, analysed_run, unpacked

CUPTI_RUN = unpacked(DATA / "vllm-h200" / "startup-cupti")
PLAIN_RUN = unpacked(DATA / "vllm-h200" / "startup")
FIRST_CROSSING_US = 1_796_241_685_347_888  # Unix µs; 132.288 s after the recording started
SEEN_AT_CROSSING = 68_362_212  # non-PyTorch bytes CUPTI saw live then (65.20 MiB), as `memtrace report`
CHROMIUM = os.environ.get("MEMTRACE_CHROMIUM", "/usr/bin/chromium")


def _packed(run: Path, *, with_events: bool = True):
    trace = load(run).traces[0]
    a = analysed_rank(trace)
    t0 = a.origin.t0_us
    return trace, a, t0, pack_rank(a, t0, with_events=with_events)


def _decode(packed) -> dict[str, np.ndarray]:
    raw = gzip.decompress(packed.blob)
    return {
        c["name"]: np.frombuffer(raw, dtype=np.dtype(c["dtype"]), count=c["length"], offset=c["offset"])
        for c in packed.columns
    }


def _step_at(t: np.ndarray, v: np.ndarray, at: float) -> float:
    """The page's pick (assets/view.js cuptiAt): the last step at or before ``at``, 0 before the first."""
    i = int(np.searchsorted(t, at, side="right")) - 1
    return 0.0 if i < 0 else float(v[i])


@pytest.fixture(scope="module")
def cupti_run():
    return _packed(CUPTI_RUN)


def test_cupti_columns_are_live_curve_to_the_byte(cupti_run):
    trace, _, t0, packed = cupti_run
    assert non_torch.has_records(trace) and len(trace.device_allocs) == 1_745
    curve = non_torch.live_curve(trace)
    col = _decode(packed)
    names = [c["name"] for c in packed.columns]
    assert names[-len(CUPTI_COLUMNS) :] == [n for n, _ in CUPTI_COLUMNS]
    assert np.array_equal(col["cupti_t"].astype(np.int64) + t0, curve.time_us)
    assert np.array_equal(col["cupti_bytes"].astype(np.int64), curve.bytes)
    assert len(curve) == 1_644 and int(curve.bytes.max()) == 68_364_089
    # the step in force at the first crossing is the report's figure
    at = FIRST_CROSSING_US - t0
    assert _step_at(col["cupti_t"], col["cupti_bytes"], at) == SEEN_AT_CROSSING
    assert _step_at(col["cupti_t"], col["cupti_bytes"], col["cupti_t"][0] - 1) == 0
    bd = non_torch.breakdown(trace, FIRST_CROSSING_US, "first crossing", curves=all_curves(trace))
    assert bd.cupti_bytes == SEEN_AT_CROSSING
    # the page's non-PyTorch column is the report's figure (steady NVML), not NVML's raw sample there, a
    # lag spike of 16,513,826,816 B (the KV cache already in NVML's figure, not yet in reserved)
    nvml = _step_at(col["dev_t"], col["dev_nontorch"], at)
    assert nvml == bd.nvml_non_torch_bytes == 808_255_488
    assert nvml - SEEN_AT_CROSSING == bd.unexplained_bytes == 739_893_276
    raw = all_curves(trace).non_torch
    assert int(raw.bytes[np.searchsorted(raw.time_us, FIRST_CROSSING_US, side="right") - 1]) == 16_513_826_816


def test_a_page_without_its_events_still_carries_the_cupti_columns():
    _, _, _, packed = _packed(CUPTI_RUN, with_events=False)
    assert [c["name"] for c in packed.columns] == [n for n, _ in (*DEVICE_COLUMNS, *CUPTI_COLUMNS)]


def test_a_trace_without_records_carries_no_cupti_columns():
    trace, a, _, packed = _packed(PLAIN_RUN)
    assert not non_torch.has_records(trace) and a.cupti is None
    assert not any(c["name"].startswith("cupti_") for c in packed.columns)
    assert packed.columns[-1]["name"] == "dev_nontorch"


# ---------- in Chromium ----------


def _main(*argv: str) -> None:
    from memtrace.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        assert main(list(argv)) == 0


@pytest.fixture(scope="module")
def browser():
    playwright_api = pytest.importorskip("playwright.sync_api", reason="Playwright is installed by .ci/setup")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (.ci/setup installs Debian's chromium)")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _open(browser, html: Path):
    errors: list[str] = []
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.goto(html.as_uri())
    page.wait_for_function("window.memtraceView && (memtraceView.ready || memtraceView.errors.length)")
    return page, errors


def _hover_at(page, at_s: float) -> dict:
    """Zoom to 80 µs around ``at_s`` and put the cursor just after it; the readout's rows."""
    page.evaluate(f"memtraceView.zoom({at_s - 40e-6!r}, {at_s + 40e-6!r})")
    page.wait_for_function(f"Math.abs(memtraceView.ranks[0].view.x0 - {at_s - 40e-6!r}) < 1e-9")
    box = page.evaluate(
        "(() => { const b = memtraceView.ranks[0].u.over.getBoundingClientRect(); return {x: b.x, y: b.y, h: b.height}; })()"
    )
    x = page.evaluate(f"memtraceView.ranks[0].u.valToPos({at_s + 0.4e-6!r}, 'x')") + box["x"]
    page.evaluate("memtraceView.ranks[0].hover = null")
    page.mouse.move(x, box["y"] + box["h"] / 2)
    page.wait_for_function("memtraceView.ranks[0].hover")
    return page.evaluate("memtraceView.ranks[0].hover")


@pytest.mark.browser
def test_readout_at_the_first_crossing_shows_what_cupti_saw(browser, tmp_path):
    out = tmp_path / "cupti.html"
    _main("view", str(CUPTI_RUN), "-o", str(out))
    page, errors = _open(browser, out)
    t0 = page.evaluate("memtraceView.ranks[0].meta.t0_us")
    at = (FIRST_CROSSING_US - t0) / 1e6
    assert round(at, 3) == 132.288
    hover = _hover_at(page, at)
    rows = hover["rows"]
    assert rows["non-PyTorch seen by CUPTI"] == "65.20 MiB (68,362,212 B, exact)"
    trace = load(CUPTI_RUN).traces[0]
    bd = non_torch.breakdown(trace, FIRST_CROSSING_US, "first crossing", curves=all_curves(trace))
    assert "808,255,488 B" in rows["non-PyTorch"] and bd.nvml_non_torch_bytes == 808_255_488  # as the report
    assert rows["non-PyTorch unexplained"] == "705.62 MiB (739,893,276 B)" and bd.unexplained_bytes == 739_893_276
    # clicking there selects the moment; the readout still says the same
    page.mouse.down()
    page.mouse.up()
    page.wait_for_function("memtraceView.selected")
    assert page.evaluate("memtraceView.ranks[0].hover.rows['non-PyTorch seen by CUPTI']").startswith("65.20 MiB")
    assert "68,362,212 B" in page.inner_text(".mt-info")
    shot = tmp_path / "cupti.png"
    page.screenshot(path=str(shot), full_page=False)
    keep = os.environ.get("MEMTRACE_VIEW_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)
    # before CUPTI's first record the page says 0 B, never nothing
    first = page.evaluate("memtraceView.ranks[0].col.cupti_t[0]")
    assert page.evaluate(f"memtraceView._internals.cuptiAt(memtraceView.ranks[0], {first - 1}).seen") == 0
    errors += page.evaluate("memtraceView.errors")
    assert not errors, errors
    page.close()


@pytest.mark.browser
def test_unexplained_is_clipped_at_zero_on_screen_and_says_so(browser, tmp_path):
    """NVML's sample can lag CUPTI's record: when CUPTI saw more than NVML's non-PyTorch, the row says 0
    and by how much it was clipped (the page's columns are edited in place to make that moment)."""
    out = tmp_path / "cupti.html"
    _main("view", str(CUPTI_RUN), "-o", str(out))
    page, errors = _open(browser, out)
    t0 = page.evaluate("memtraceView.ranks[0].meta.t0_us")
    at = (FIRST_CROSSING_US - t0) / 1e6
    page.evaluate(
        f"(() => {{ const c = memtraceView.ranks[0].col; const i = memtraceView._internals.upper(c.dev_t, {FIRST_CROSSING_US - t0}) - 1;"
        f" c.dev_nontorch[i] = {SEEN_AT_CROSSING - 1_000}; }})()"
    )
    rows = _hover_at(page, at)["rows"]
    assert rows["non-PyTorch unexplained"] == "0 B (clipped at 0: CUPTI saw 1,000 B more than NVML's non-PyTorch)"
    assert not errors + page.evaluate("memtraceView.errors")
    page.close()


@pytest.mark.browser
def test_a_trace_without_records_has_no_cupti_row(browser, tmp_path):
    out = tmp_path / "plain.html"
    _main("view", str(PLAIN_RUN), "-o", str(out))
    page, errors = _open(browser, out)
    assert page.evaluate("'cupti_t' in memtraceView.ranks[0].col") is False
    box = page.evaluate(
        "(() => { const b = memtraceView.ranks[0].u.over.getBoundingClientRect(); return {x: b.x, y: b.y, w: b.width, h: b.height}; })()"
    )
    page.mouse.move(box["x"] + box["w"] * 0.5, box["y"] + box["h"] / 2)
    page.wait_for_function("memtraceView.ranks[0].hover")
    rows = page.evaluate("memtraceView.ranks[0].hover.rows")
    assert "non-PyTorch" in rows and not any("CUPTI" in k or "unexplained" in k for k in rows)
    assert "CUPTI" not in page.inner_text(".mt-info")
    assert not errors + page.evaluate("memtraceView.errors")
    page.close()


@pytest.mark.browser
def test_a_page_carrying_only_an_overview_shows_the_cupti_rows_too(browser, tmp_path):
    from memtrace.plots.view_html import build_page

    trace, a, t0, _ = _packed(CUPTI_RUN)
    out = tmp_path / "overview.html"
    out.write_text(build_page(analysed_run([a.trace]), title="overview", max_events=1_000, api=False))
    page, errors = _open(browser, out)
    assert page.evaluate("memtraceView.ranks[0].L") is None  # no events in this page
    box = page.evaluate(
        "(() => { const b = memtraceView.ranks[0].u.over.getBoundingClientRect(); return {x: b.x, y: b.y, h: b.height}; })()"
    )
    at = (FIRST_CROSSING_US - t0) / 1e6
    page.mouse.move(page.evaluate(f"memtraceView.ranks[0].u.valToPos({at + 1.0!r}, 'x')") + box["x"], box["y"] + 50)
    page.wait_for_function("memtraceView.ranks[0].hover")
    hover = page.evaluate("memtraceView.ranks[0].hover")
    seen = int(non_torch.live_curve(trace).at(round(hover["t_us"]) + t0))
    assert hover["rows"]["non-PyTorch seen by CUPTI"].endswith(f"({seen:,} B, exact)")
    assert "non-PyTorch unexplained" in hover["rows"]
    assert not errors + page.evaluate("memtraceView.errors")
    page.close()
