"""`memtrace view` pages opened in a real Chromium (Debian's, driven by Playwright; no browser download).

The pages are written from the real vLLM 0.25.1 start-up recorded on the H200 (tests/data/vllm-h200) and
from the real 16 GiB-card run that died of OOM (tests/data/h200/startup-cap16g); each test fails on any
JavaScript error or console error. The figures asserted come from `memtrace report --json` of the same
run, so the page must agree with the report to the byte.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from testdata import DATA, analysed_run, unpacked

pytestmark = pytest.mark.browser
playwright_api = pytest.importorskip("playwright.sync_api", reason="Playwright is installed by .ci/setup")
CHROMIUM = os.environ.get("MEMTRACE_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (.ci/setup installs Debian's chromium)", allow_module_level=True)

STARTUP = unpacked(DATA / "vllm-h200" / "startup")
OOM_RUN = DATA / "h200" / "startup-cap16g"


def _main(*argv: str) -> str:
    from memtrace.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(argv)) == 0
    return out.getvalue()


def _report(run: Path) -> dict:
    return json.loads(_main("report", str(run), "--json"))


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


class Page:
    """A page of `memtrace view` with every JavaScript error collected."""

    def __init__(self, browser, html: Path | str, width: int = 1400):
        self.errors: list[str] = []
        self.page = browser.new_page(viewport={"width": width, "height": 1000})
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        self.page.goto(html if isinstance(html, str) else html.as_uri())
        self.page.wait_for_function("window.memtraceView && (memtraceView.ready || memtraceView.errors.length)")
        self.check()

    def js(self, expr: str):
        return self.page.evaluate(expr)

    def check(self) -> None:
        errors = self.errors + self.js("memtraceView.errors")
        assert not errors, errors

    def rank(self, r: int = 0) -> dict:
        return self.js(f"(() => {{ const R = memtraceView.ranks[{r}]; return {{drawn: R.drawn, view: R.view}}; }})()")

    def chart_box(self, r: int = 0) -> dict:
        return self.js(
            f"(() => {{ const b = memtraceView.ranks[{r}].u.over.getBoundingClientRect(); return {{x: b.x, y: b.y, w: b.width, h: b.height}}; }})()"
        )

    def x_of(self, seconds: float, r: int = 0) -> float:
        return self.js(f"memtraceView.ranks[{r}].u.valToPos({float(seconds)!r}, 'x')") + self.chart_box(r)["x"]

    def zoom(self, x0: float, x1: float) -> None:
        self.js(f"memtraceView.zoom({x0!r}, {x1!r})")
        self.page.wait_for_function(f"memtraceView.ranks.every(r => r.view && Math.abs(r.view.x0 - {x0!r}) < 1e-9)")

    def close(self) -> None:
        self.check()
        self.page.close()


@pytest.fixture(scope="module")
def startup_html(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("view") / "startup.html"
    _main("view", str(STARTUP), "-o", str(out))
    return out


@pytest.fixture
def startup(browser, startup_html):
    page = Page(browser, startup_html)
    yield page
    page.close()


def test_phases_target_capacity_and_crossing_are_drawn(startup):
    drawn = startup.rank()["drawn"]
    assert drawn["phase_names"] == [
        "init_device",
        "load_model",
        "determine_available_memory",
        "determine_available_memory/profile_run",
        "determine_available_memory/cudagraph_profile",
        "kv_cache_init",
        "compile_or_warm_up",
        "compile_or_warm_up/kernel_warmup",
        "compile_or_warm_up/capture_model",
    ]
    assert drawn["target"] is not None and drawn["capacity"] is not None and drawn["crossing"] is not None
    assert drawn["capacity"] < drawn["target"]  # the card's 139.8 GiB lies above the 128.6 GiB target
    assert drawn["oom"] is None  # this start-up survived


def test_clicking_the_peak_shows_the_reports_allocated_at_peak_to_the_byte(startup):
    peak = _report(STARTUP)["traces"][0]["peak"]
    t0 = startup.js("memtraceView.ranks[0].meta.t0_us")
    at = (peak["state_us"] - t0) / 1e6
    startup.zoom(at - 40e-6, at + 40e-6)  # 80 µs across the chart: one microsecond is ~13 px
    x = startup.x_of(at + 0.4e-6)
    box = startup.chart_box()
    startup.page.mouse.click(x, box["y"] + box["h"] / 2)
    startup.page.wait_for_function("memtraceView.selected")
    sel = startup.js("memtraceView.selected")
    assert sel["event"] == peak["event_index"]
    assert sel["live_bytes"] == peak["allocated_bytes"] == 137_882_827_252
    assert startup.page.inner_text("#mt-live-0") == "128.41 GiB (137,882,827,252 B)"
    assert sel["ms"] < 500
    # the landmark button lands on the same moment
    startup.js("memtraceView.selected = null")
    startup.page.click("button[data-landmark=peak]")
    startup.page.wait_for_function("memtraceView.selected")
    assert startup.js("memtraceView.selected.live_bytes") == peak["allocated_bytes"]
    assert startup.page.locator(".mt-icicle .mt-node").count() >= 3
    assert startup.page.locator(".mt-events tr.mt-here").count() == 1


def test_the_first_crossing_landmark_says_what_the_report_says(startup):
    """The landmark's line names the report's first crossing: its curve, the bytes when it crossed, the moment
    on the report's time origin, its phase, and the highest point of that excursion with its phase."""
    from memtrace.units import format_gib

    doc = _report(STARTUP)["traces"][0]
    c, t0 = doc["crossings"][0], doc["t0_us"]
    assert startup.js("memtraceView.ranks[0].meta.t0_us") == t0  # one origin: the report's
    startup.js("memtraceView.selected = null")
    startup.page.click('button[data-landmark="first crossing (device used)"]')
    startup.page.wait_for_function("memtraceView.selected")
    line = startup.page.inner_text(".mt-landmark-line")
    assert line.startswith(
        f"first crossing (device used): NVML device used {format_gib(c['at_cross_bytes'])} "
        f"at {(c['time_us'] - t0) / 1e6:.3f} s in {c['phase_path']}; "
        f"highest {format_gib(c['max_bytes'])} in {c['max_phase_path']}"
    ), line
    # the report's own words for the same crossing (124.06 s in kv_cache_init, highest in kernel_warmup)
    assert (c["phase_path"], c["max_phase_path"]) == ("kv_cache_init", "compile_or_warm_up/kernel_warmup")
    assert f"crossed it at {(c['time_us'] - t0) / 1e6:.2f} s in kv_cache_init" in _main("report", str(STARTUP))
    # the selection is the last event at or before the crossing's microsecond
    import numpy as np
    from memtrace import load

    times = np.maximum.accumulate(load(STARTUP).traces[0].events["time_us"])
    assert startup.js("memtraceView.selected.event") == int(np.searchsorted(times, c["time_us"], "right")) - 1


def test_wheel_and_drag_zoom_reach_exact_steps(startup):
    from memtrace import load

    trace = load(STARTUP).traces[0]
    times = sorted(int(t) for t in trace.events["time_us"])
    assert startup.rank()["view"]["exact"] is False  # 14,767 events do not fit 1,000 pixels exactly
    box = startup.chart_box()
    x = startup.x_of((trace.events["time_us"][5528] - startup.js("memtraceView.ranks[0].meta.t0_us")) / 1e6)
    startup.page.mouse.move(x, box["y"] + box["h"] / 2)
    for _ in range(30):
        startup.page.mouse.wheel(0, -200)
        startup.page.wait_for_timeout(30)
        if startup.rank()["view"]["exact"]:
            break
    view = startup.rank()["view"]
    assert view["exact"] is True
    t0 = startup.js("memtraceView.ranks[0].meta.t0_us")
    lo, hi = t0 + view["x0"] * 1e6, t0 + view["x1"] * 1e6
    inside = sum(1 for t in times if lo < t <= hi)
    assert abs(view["events"] - inside) <= 1 and view["points"] >= view["events"] + 1
    # a drag narrows the window further
    startup.page.mouse.move(box["x"] + box["w"] * 0.3, box["y"] + 50)
    startup.page.mouse.down()
    startup.page.mouse.move(box["x"] + box["w"] * 0.6, box["y"] + 50, steps=5)
    startup.page.mouse.up()
    startup.page.wait_for_function(
        f"memtraceView.ranks[0].view.x1 - memtraceView.ranks[0].view.x0 < {view['x1'] - view['x0']}"
    )


def test_hover_shows_exact_bytes_and_the_phase(startup):
    box = startup.chart_box()
    startup.page.mouse.move(box["x"] + box["w"] * 0.5, box["y"] + box["h"] / 2)
    startup.page.wait_for_function("memtraceView.ranks[0].hover")
    rows = startup.js("memtraceView.ranks[0].hover.rows")
    assert rows["phase"] == "determine_available_memory/profile_run"  # the middle of the run is spent profiling
    assert rows["allocated"].endswith(" B)") and "GiB (" in rows["allocated"]
    assert rows["time"].endswith(" s")


def test_screenshot_of_the_page(startup, tmp_path):
    startup.page.click("button[data-landmark=peak]")
    startup.page.wait_for_function("memtraceView.selected")
    shot = tmp_path / "view.png"
    startup.page.screenshot(path=str(shot), full_page=True)
    keep = os.environ.get("MEMTRACE_VIEW_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)
    assert shot.stat().st_size > 50_000  # a drawn page, not a blank one


def test_oom_run_draws_the_oom_and_shows_stacks_at_it(browser, tmp_path):
    out = tmp_path / "oom.html"
    _main("view", str(OOM_RUN), "-o", str(out))
    page = Page(browser, out)
    assert page.rank()["drawn"]["oom"] is not None
    page.page.click("button[data-landmark=OOM]")
    page.page.wait_for_function("memtraceView.selected")
    report = _report(OOM_RUN)["traces"][0]
    assert page.js("memtraceView.selected.live_bytes") > 0
    assert page.page.locator(".mt-icicle .mt-node").count() > 5  # real Python stacks, several frames deep
    page.page.click("button[data-landmark=peak]")
    page.page.wait_for_function(f"memtraceView.selected.event === {report['peak']['event_index']}")
    assert page.js("memtraceView.selected.live_bytes") == report["peak"]["allocated_bytes"]
    page.close()


def test_two_ranks_get_one_lane_each_on_a_shared_time_axis(browser, tmp_path):
    run_dir = tmp_path / "tp2"
    run_dir.mkdir()
    for rank, name in enumerate(["startup-cap32g", "startup-cap44g"]):
        dst = run_dir / f"vm-pid{1000 + rank}-rank{rank}.memtrace"
        shutil.copy(next(unpacked(DATA / "h200" / name).glob("*.memtrace")), dst)
        db = sqlite3.connect(dst)
        with db:
            (doc,) = db.execute("SELECT value FROM meta WHERE key='process'").fetchone()
            process = {**json.loads(doc), "rank": rank, "local_rank": rank, "world_size": 2, "pid": 1000 + rank}
            db.execute("UPDATE meta SET value=? WHERE key='process'", (json.dumps(process),))
        db.close()
    out = tmp_path / "tp2.html"
    _main("view", str(run_dir), "-o", str(out))
    page = Page(browser, out)
    assert page.js("memtraceView.ranks.length") == 2
    assert page.page.locator("section.mt-lane h2").all_inner_texts() == ["rank 0", "rank 1"]
    page.zoom(2.0, 3.0)
    views = [page.rank(r)["view"] for r in (0, 1)]
    assert views[0]["x0"] == views[1]["x0"] == 2.0 and views[0]["x1"] == views[1]["x1"] == 3.0
    page.close()


def test_served_page_of_a_run_too_big_for_one_page_zooms_and_clicks_through_the_server(browser):
    from memtrace import load
    from memtrace.cli._serve import start

    trace = load(STARTUP).traces[0]
    server = start(analysed_run([trace]), title="served", max_events=1_000)
    try:
        assert server.server_address[0] == "127.0.0.1"
        page = Page(browser, server.url)
        assert page.js("memtraceView.ranks[0].L") is None  # the page carries no events: the server answers
        peak = _report(STARTUP)["traces"][0]["peak"]
        at = (peak["state_us"] - page.js("memtraceView.ranks[0].meta.t0_us")) / 1e6
        page.zoom(at - 40e-6, at + 40e-6)
        assert page.rank()["view"]["exact"] is True
        box = page.chart_box()
        page.page.mouse.click(page.x_of(at + 0.4e-6), box["y"] + box["h"] / 2)
        page.page.wait_for_function("memtraceView.selected")
        assert page.js("memtraceView.selected.live_bytes") == peak["allocated_bytes"]
        assert page.page.inner_text("#mt-live-0") == "128.41 GiB (137,882,827,252 B)"
        page.close()
    finally:
        server.shutdown()
        server.server_close()


def test_icicle_paths_in_the_page_are_the_flame_graphs_with_flashinfer_hook_frames(browser, tmp_path):
    """The real FlashInfer 0.6.13 probe: hooked workspace allocations get their [hook] frame in the page too."""
    from memtrace import load
    from memtrace.analysis.holders.flame import flame_at

    run = DATA / "vllm-h200" / "flashinfer-probe"
    out = tmp_path / "probe.html"
    _main("view", str(run), "-o", str(out))
    page = Page(browser, out)
    trace = load(run).traces[0]
    e = _report(run)["traces"][0]["peak"]["event_index"]
    groups = page.js(f"memtraceView.live(memtraceView.ranks[0], {e}).then(l => l.groups.map(g => [g.path, g.bytes]))")
    expected = flame_at(trace, event_index=e).stacks
    assert {tuple(p): b for p, b in groups} == expected
    assert any(label.startswith("[hook] ") for path in expected for label in path)
    page.close()


def test_a_vllm_034_page_draws_the_kv_cache_outside_pytorch_and_reads_it_out_exactly(browser, tmp_path):
    """vLLM 0.34 (the H200 start-up in tests/data/vllm-h200-034): the KV cache committed through CUDA's VMM
    API has its legend entry and band, and the hover after its commit reads vLLM's "Extended KV cache to
    258528 blocks" to the byte, beside PyTorch's reserved memory."""
    from vllm034_data import run_dir

    out = tmp_path / "moe-ext.html"
    _main("view", str(run_dir("moe-ext")), "-o", str(out))
    page = Page(browser, out)
    try:
        doc = _report(run_dir("moe-ext"))["traces"][0]
        label = page.js("memtraceView.ranks[0].meta.vmm.label")
        assert page.page.inner_text("[data-legend=vmm_kv]").strip() == label
        assert page.js("memtraceView.ranks[0].meta.vmm.held_peak_bytes") == doc["peak_held"]["bytes"]
        end = page.js("memtraceView.ranks[0].meta.end_us") / 1e6
        box = page.chart_box()
        page.page.mouse.move(page.x_of(end - 0.05), box["y"] + box["h"] / 2)
        page.page.wait_for_function("memtraceView.ranks[0].hover")
        rows = page.js("memtraceView.ranks[0].hover.rows")
        assert rows[label] == "126.23 GiB (135,543,128,064 B)"  # vLLM: 258528 blocks (126.23 GiB)
        assert rows["reserved"].startswith("11.12 GiB (")  # PyTorch's own: the cache is not in it
        # during warm-up the band holds only the pages vLLM committed for it (16 MiB, README), not the cache
        page.page.mouse.move(page.x_of(160.0), box["y"] + box["h"] / 2)
        page.page.wait_for_function("memtraceView.ranks[0].hover.t_us < 170e6")
        assert page.js("memtraceView.ranks[0].hover.rows")[label] == "0.02 GiB (16,777,216 B)"
    finally:
        page.close()


@pytest.mark.parametrize("width", [1280, 1400])
def test_the_chart_uses_the_windows_width_and_its_names_stay_off_the_curves(browser, startup_html, width, tmp_path):
    """Issue 34: the chart was ~570 px wide in a 1,200-1,400 px window (a 320 px panel beside it), and the phase
    names and the peak and crossing labels were drawn inside the plot, on the curves and the capacity line."""
    page = Page(browser, startup_html, width=width)
    try:
        drawn = page.rank()["drawn"]
        plot, box = drawn["plot"], page.chart_box()
        assert box["w"] > 0.72 * width  # 1280: 996 px of plot (was 644 px beside a 320 px panel)
        names = {lab["label"] for lab in drawn["labels"]}
        assert any(n.startswith("peak ") for n in names) and any(n.startswith("crossed ") for n in names)
        for lab in drawn["labels"]:  # every moment's name above the plot, inside the chart's width
            assert lab["y"] + lab["h"] <= plot["top"], lab
            assert plot["left"] <= lab["x"] and lab["x"] + lab["w"] <= plot["left"] + plot["width"] + 1, lab
        assert {g["label"].split(" ")[0] for g in drawn["gutter"]} == {"target", "capacity"}
        # the hover table sits under the chart, not beside it
        info = page.js("(() => { const b = memtraceView.ranks[0].info.getBoundingClientRect(); return b.y; })()")
        assert info >= box["y"] + box["h"]
        page.page.screenshot(path=str(tmp_path / f"view-{width}.png"))
    finally:
        page.close()


@pytest.fixture(scope="module")
def serving_trace(tmp_path_factory):
    """The fake serving run (``serving_fakes``: a real H200 start-up's history replayed, an OOM an hour in)."""
    from serving_fakes import write_fake_serving

    with pytest.MonkeyPatch.context() as mp:
        return write_fake_serving(tmp_path_factory.mktemp("serving") / "fake.memtrace", mp)


@pytest.fixture
def serving(browser, serving_trace, tmp_path):
    out = tmp_path / "serving.html"
    _main("view", serving_trace.path, "-o", str(out))
    page = Page(browser, out)
    yield page
    page.close()


def _folded(run: str, at: str, tmp_path: Path) -> dict[tuple[str, ...], int]:
    """`memtrace flame RUN --at AT -f folded`, read back: {frames: bytes}."""
    out = tmp_path / "at.folded"
    _main("flame", run, "--at", at, "-f", "folded", "-o", str(out), "--force")
    lines = (line.rsplit(" ", 1) for line in out.read_text().splitlines())
    return {tuple(path.split(";")): int(b) for path, b in lines}


def _page_groups(page: Page) -> dict[tuple[str, ...], int]:
    """What the page lists as live at its selection (the serving window's part): {frames: bytes}."""
    e = page.js("memtraceView.selected.event")
    groups = page.js(f"memtraceView.live(memtraceView.ranks[0].W, {e}).then(l => l.groups.map(g => [g.path, g.bytes]))")
    return {tuple(p): int(b) for p, b in groups}


def _click_in_the_window(page: Page, trace, k: int = 2500) -> int:
    """Zoom to 80 µs around the window's event ``k`` (single allocator events: one microsecond is ~14 px), click
    0.4 µs after it; its time in page microseconds."""
    t = int(trace.window.events["time_us"][k]) - page.js("memtraceView.ranks[0].meta.t0_us")
    page.zoom((t - 40) / 1e6, (t + 40) / 1e6)
    assert page.rank()["view"]["exact"] is True
    box = page.chart_box()
    page.page.mouse.click(page.x_of((t + 0.4) / 1e6), box["y"] + box["h"] / 2)
    page.page.wait_for_function("memtraceView.selected")
    return t


def test_a_serving_trace_draws_its_window_after_a_labelled_gap_with_the_oom_and_a_serving_bar(serving, serving_trace):
    w, t0 = serving_trace.window, serving.js("memtraceView.ranks[0].meta.t0_us")
    items = serving.js("[...document.querySelectorAll('.mt-serving li')].map(e => e.textContent)")
    assert items[1].startswith(
        "Failed allocation at 3609.85 s in serving: requested 3.00 GiB (3,221,225,472 B), device free 1024.00 MiB"
    )
    assert serving.js("document.querySelector('.mt-serving h3').textContent").endswith(
        "after the hatched gap, which was not recorded)"
    )
    view, drawn = serving.rank()["view"], serving.rank()["drawn"]
    assert view["x1"] == pytest.approx((w.end_us - t0) / 1e6, abs=1e-6)  # the chart runs to the window's end
    assert drawn["phase_names"] == ["load_model", "profile_run", "serving"]
    gap, plot = drawn["gap"], drawn["plot"]
    assert gap["label"] == "GAP 3600 s\nnot recorded; dropped:\n1,630 events, 0 samples, 0 steps"
    # the hour is squeezed, as the plot squeezes it: start-up, the gap, then the window, each its own width
    assert plot["left"] + 0.6 * plot["width"] < gap["x0"] < gap["x1"] < plot["left"] + 0.8 * plot["width"]
    assert gap["x1"] < drawn["oom"] <= plot["left"] + plot["width"] + 1  # the OOM in the window, marked
    assert serving.js("memtraceView.ranks[0].u.axes[0]._values").count("3609.6") == 1  # ticks on each side


def test_the_gap_is_drawn_as_a_gap_never_as_a_line_across_it(serving, serving_trace):
    """Every series is null at the one point the chart has inside the gap (no curve joins start-up's last value
    to the window's first), and the plot's pixels over the gap are the band's: white and its grey hatching."""
    t0 = serving.js("memtraceView.ranks[0].meta.t0_us")
    a, b = (serving_trace.window.startup_end_us - t0) / 1e6, (serving_trace.window.start_us - t0) / 1e6
    data = serving.js("memtraceView.ranks[0].u.data")
    inside = [i for i, x in enumerate(data[0]) if a < x < b]
    assert len(inside) == 1 and all(col[inside[0]] is None for col in data[1:])
    assert data[0][inside[0] - 1] <= a and data[0][inside[0] + 1] >= b
    gap, plot = serving.rank()["drawn"]["gap"], serving.rank()["drawn"]["plot"]
    pixels = serving.js(f"""(() => {{
        const c = memtraceView.ranks[0].u.ctx, d = devicePixelRatio, out = [];
        for (const f of [0.03, 0.08, 0.92, 0.97]) {{  /* above and below the words written in the band */
            const y = Math.round(({plot["top"]} + f * {plot["height"]}) * d);
            const px = c.getImageData(Math.round(({gap["x0"]} + 3) * d), y, Math.round(({gap["x1"]} - {gap["x0"]} - 6) * d), 1).data;
            for (let i = 0; i < px.length; i += 4) out.push([px[i], px[i + 1], px[i + 2]]);
        }}
        return out; }})()""")
    assert pixels and all(max(p) - min(p) <= 6 and min(p) >= 150 for p in pixels)  # greys from white to hatching
    assert sum(p == [255, 255, 255] for p in pixels) > 0.3 * len(pixels)  # hatched, not a filled area


def test_zooming_into_the_window_reaches_single_events_and_a_click_lists_what_flame_at_that_time_lists(
    serving, serving_trace, tmp_path
):
    t = _click_in_the_window(serving, serving_trace)
    sel = serving.js("memtraceView.selected")
    assert sel["part"] == "serving" and sel["t_us"] == t
    folded = _folded(serving_trace.path, f"{t}us", tmp_path)  # the window analysed as its own trace, as flame does
    assert _page_groups(serving) == folded
    assert sel["live_bytes"] == sum(folded.values())
    assert serving.page.inner_text("#mt-live-0").endswith(f"({sum(folded.values()):,} B)")
    assert "live after serving window event #" in serving.page.inner_text(".mt-live h3")
    assert serving.page.locator(".mt-icicle .mt-node").count() > 3


def test_the_oom_landmark_shows_what_flame_at_oom_shows(serving, serving_trace, tmp_path):
    serving.page.click("button[data-landmark=OOM]")
    serving.page.wait_for_function("memtraceView.selected")
    folded = _folded(serving_trace.path, "oom", tmp_path)
    assert serving.js("memtraceView.selected.part") == "serving"
    assert _page_groups(serving) == folded
    held = sum(s.requested_bytes for s in serving_trace.window.segments)  # the allocator's own state at the OOM
    assert serving.js("memtraceView.selected.live_bytes") == held


def test_a_click_in_the_gap_says_it_was_not_recorded(serving, serving_trace):
    gap, box = serving.rank()["drawn"]["gap"], serving.chart_box()
    x = box["x"] + (gap["x0"] + gap["x1"]) / 2 - serving.rank()["drawn"]["plot"]["left"]
    serving.page.mouse.move(x, box["y"] + box["h"] / 2)
    serving.page.wait_for_function("memtraceView.ranks[0].hover")
    assert serving.js("memtraceView.ranks[0].hover.rows")["memory"] == "not recorded (dropped from the serving ring)"
    serving.page.mouse.click(x, box["y"] + box["h"] / 2)
    serving.page.wait_for_function("memtraceView.selected")
    sel = serving.js("memtraceView.selected")
    assert sel["part"] == "gap" and sel["live_bytes"] is None
    assert serving.page.inner_text(".mt-live h3").endswith("lies in the gap after start-up: not recorded")
    assert serving.page.inner_text("#mt-gap-0").startswith(
        "Between start-up's end (9.427 s) and the serving window's first kept record (3609.553 s) the ring dropped "
        "1,630 allocator events, 0 NVML samples and 0 scheduler steps"
    )
    assert serving.page.locator(".mt-icicle").count() == 0  # nothing listed as live


def test_a_served_page_of_a_serving_run_asks_the_server_for_the_window(browser, serving_trace, tmp_path):
    from memtrace.cli._serve import start

    server = start(analysed_run([serving_trace]), title="served", max_events=1_000)
    try:
        page = Page(browser, server.url)
        assert page.js("memtraceView.ranks[0].W.L") is None  # no events on the page: the server answers
        t = _click_in_the_window(page, serving_trace)
        folded = _folded(serving_trace.path, f"{t}us", tmp_path)
        assert page.js("memtraceView.selected.part") == "serving"
        assert page.js("memtraceView.selected.live_bytes") == sum(folded.values())
        page.close()
    finally:
        server.shutdown()
        server.server_close()


def test_screenshots_of_a_serving_page(serving, serving_trace, tmp_path):
    """The whole run (start-up, the gap, the window with its OOM), then the window zoomed and clicked."""
    keep = os.environ.get("MEMTRACE_VIEW_SCREENSHOT_DIR")
    shots = [tmp_path / "serving.png", tmp_path / "serving-window.png"]
    serving.page.screenshot(path=str(shots[0]))
    t0, w = serving.js("memtraceView.ranks[0].meta.t0_us"), serving_trace.window
    serving.zoom((w.start_us - t0) / 1e6, (w.end_us - t0) / 1e6)
    serving.page.click("button[data-landmark='serving peak']")
    serving.page.wait_for_function("memtraceView.selected")
    serving.page.screenshot(path=str(shots[1]), full_page=True)
    for shot in shots:
        assert shot.stat().st_size > 50_000  # a drawn page, not a blank one
        if keep:
            shutil.copy(shot, Path(keep) / shot.name)


def test_a_cpu_profile_page_prints_sizes_as_the_report_does(browser, tmp_path):
    """vLLM's CPU worker profiled (tests/data/vllm-cpu-profiler/tp1): a 9,460 B peak of allocated memory reads
    "9.24 KiB" on the page as in the report (``plots/assets/view_units.js``), never "0.00 GiB", and the axis
    counts KiB."""
    out = tmp_path / "tp1.html"
    _main("view", str(DATA / "vllm-cpu-profiler" / "tp1"), "-o", str(out))
    page = Page(browser, out)
    labels = page.js("memtraceView.ranks[0].u.axes.map((a) => a.label)")
    assert labels[1] == "KiB"
    page.page.click("button[data-landmark=peak]")
    page.page.wait_for_function("memtraceView.selected")
    assert page.js("memtraceView.selected.live_bytes") == 9_460
    assert page.page.inner_text("#mt-live-0") == "9.24 KiB (9,460 B)"
    body = page.page.inner_text("body")
    assert "0.00 GiB" not in body.split("Report")[0]
    page.close()


def test_a_cpu_profiler_page_shows_only_what_such_a_trace_holds(browser, tmp_path):
    """vLLM's profiler on vllm-cpu (tests/data/vllm-cpu-profiler/tp2): PyTorch allocated of the CPU alone, a few
    KiB, no phases. The page's legend, hover and phase table name no reserved memory and no NVML (a trace of the
    CPU has neither), and its size axis reads KiB."""
    out = tmp_path / "tp2.html"
    _main("view", str(DATA / "vllm-cpu-profiler" / "tp2"), "-o", str(out))
    page = Page(browser, out)
    legend = page.js("[...document.querySelectorAll('.mt-legend span')].map(e => e.textContent)")
    assert "other" in legend and not {"reserved", "device used (NVML)", "non-PyTorch", "target"} & set(legend)
    assert (
        page.js("[...document.querySelectorAll('.mt-no-phases')].map(e => e.textContent)")
        == ["No phases recorded."] * 2
    )
    assert page.js("memtraceView.ranks[0].u.axes[1].label") == "KiB"
    box = page.chart_box()
    page.page.mouse.move(page.x_of(0.058), box["y"] + box["h"] / 2)
    page.page.wait_for_function("memtraceView.ranks[0].hover")
    rows = page.js("memtraceView.ranks[0].hover.rows")
    assert "allocated" in rows and "reserved" not in rows and "device used" not in rows
    page.close()
