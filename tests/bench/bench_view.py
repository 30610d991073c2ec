"""Benchmark: `memtrace view` on a 1,000,000-event trace in headless Chromium; prints figures.

Uses the SYNTHETIC trace of ``bench_store_report.build`` (alloc/free churn, ~2,000 stacks of 12
frames, nested vLLM phases, 100 Hz NVML samples) and measures:

- writing the page (``memtrace view`` in-process) and its size in bytes per event (goal <= 24);
- opening it in Debian's Chromium through Playwright (navigation to ``memtraceView.ready``: data
  inflated, curves computed from the event arrays, charts drawn; goal <= 2 s);
- a click on the peak landmark until the live set is shown (goal <= 0.5 s), and that its bytes equal
  ``memtrace report``'s allocated-at-peak; a wheel zoom until exact steps are drawn;
- beside it, ``python -m torch.cuda._memory_viz trace_plot`` on the same events (memtrace's own
  memory-viz export): its HTML size, and what its page needs from the network;
- with ``--serve-events N`` (e.g. 10,000,000): a run too big for one page, served by
  ``memtrace view --serve``: the overview page's open time, and zoom and click answers from the server.

Run: ``python tests/bench/bench_view.py [--events N] [--serve-events N] [--no-torch]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store_report import build  # noqa: E402

CHROMIUM = "/usr/bin/chromium"


def cli(*argv: str) -> str:
    from memtrace.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(list(argv)) == 0, argv
    return out.getvalue()


def open_page(browser, url: str) -> tuple[object, float]:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    t = time.perf_counter()
    page.goto(url)
    page.wait_for_function("window.memtraceView && memtraceView.ready", timeout=120_000)
    opened = time.perf_counter() - t
    assert not errors, errors
    return page, opened


def click_peak(page) -> tuple[float, dict]:
    page.evaluate("memtraceView.selected = null")
    t = time.perf_counter()
    page.click("button[data-landmark=peak]")
    page.wait_for_function("memtraceView.selected", timeout=60_000)
    return time.perf_counter() - t, page.evaluate("memtraceView.selected")


def zoom_to_exact(page, x: float) -> tuple[int, float]:
    t = time.perf_counter()
    for k in range(1, 80):
        lo, hi = page.evaluate("[memtraceView.ranks[0].view.x0, memtraceView.ranks[0].view.x1]")
        f = 0.25
        page.evaluate(f"memtraceView.zoom({x - (x - lo) * f!r}, {x + (hi - x) * f!r})")
        page.wait_for_function(f"Math.abs(memtraceView.ranks[0].view.x0 - {x - (x - lo) * f!r}) < 1e-9", timeout=60_000)
        if page.evaluate("memtraceView.ranks[0].view.exact"):
            return k, (time.perf_counter() - t) / k
    raise AssertionError("never reached exact steps")


def bench_page(browser, path: Path, tmp: Path, n: int) -> None:
    html = tmp / "bench-view.html"
    t = time.perf_counter()
    cli("view", str(path), "-o", str(html), "--force")
    write_s = time.perf_counter() - t
    size = html.stat().st_size
    print(f"view       wrote {size:,} bytes = {size / n:.2f} bytes/event in {write_s:.2f} s (goal <= 24 B/event)")
    peak = json.loads(cli("report", str(path), "--json"))["traces"][0]["peak"]
    opens = []
    for _ in range(3):
        page, opened = open_page(browser, html.as_uri())
        opens.append((opened, page.evaluate("memtraceView.loadMs")))
        page.close()
    best = min(opens)
    print(f"open       {best[0]:.2f} s to ready (best of 3; page's own {best[1] / 1000:.2f} s) (goal <= 2 s)")
    page, _ = open_page(browser, html.as_uri())
    clicks = [click_peak(page) for _ in range(3)]
    s, sel = min(clicks, key=lambda c: c[0])
    print(
        f"click      {s * 1000:.0f} ms to show the live set at the peak (page's own {sel['ms']:.0f} ms) "
        f"(goal <= 500 ms); {sel['count']:,} live allocations, {sel['live_bytes']:,} B"
    )
    assert sel["live_bytes"] == peak["allocated_bytes"], (sel, peak)
    print(f"exact      live bytes at the peak equal report's allocated-at-peak ({peak['allocated_bytes']:,} B)")
    x = page.evaluate("(memtraceView.ranks[0].meta.peak.state_us - memtraceView.ranks[0].meta.t0_us) / 1e6")
    steps, per = zoom_to_exact(page, x)
    print(f"zoom       exact steps after {steps} zooms of 4x, {per * 1000:.0f} ms per zoom")
    page.close()


def bench_torch(path: Path, tmp: Path, n: int) -> Path:
    pickle_path = tmp / "bench-snapshot.pickle"
    cli("export", str(path), "-f", "memory-viz", "-o", str(pickle_path))
    out = tmp / "bench-trace-plot.html"
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(pickle_path), "-o", str(out)],
        check=True,
        capture_output=True,
    )
    size = out.stat().st_size
    text = out.read_text(errors="replace")
    urls = sorted(set(re.findall(r"""https?://[^"'\s)]+""", text[:4000])))
    print(f"torch      trace_plot wrote {size:,} bytes = {size / n:.2f} bytes/event in {time.perf_counter() - t:.1f} s")
    print(f"torch      its page imports its code from the network: {', '.join(urls) or 'nothing'}")
    return out


def torch_offline(browser, html: Path) -> None:
    """Open torch's trace_plot page with the network cut off, as on an air-gapped machine or CI artifact."""
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route("http*://**", lambda route: route.abort())
    page.goto(html.as_uri())
    page.wait_for_timeout(1500)
    drawn = page.evaluate("document.querySelectorAll('svg, canvas').length")
    print(f"torch      offline: {drawn} charts drawn; errors: {'; '.join(e[:100] for e in errors[:2]) or 'none'}")
    page.close()


def bench_serve(browser, n: int, tmp: Path) -> None:
    from memtrace.cli._serve import start
    from memtrace.store import load_trace, save_trace

    path = tmp / "bench-serve.memtrace"
    save_trace(build(n), path)
    trace = load_trace(path)
    t = time.perf_counter()
    from memtrace.analysis.analysed.run import analyse

    server = start(analyse([trace]), title="bench", max_events=4_000_000)
    print(f"serve      {len(trace.events):,} events analysed and served in {time.perf_counter() - t:.1f} s")
    try:
        page, opened = open_page(browser, server.url)
        print(f"serve      overview page {len(server.page):,} bytes, open {opened:.2f} s")
        s, sel = click_peak(page)
        print(f"serve      click on the peak {s * 1000:.0f} ms ({sel['count']:,} live allocations)")
        x = page.evaluate("(memtraceView.ranks[0].meta.peak.state_us - memtraceView.ranks[0].meta.t0_us) / 1e6")
        steps, per = zoom_to_exact(page, x)
        print(f"serve      exact steps after {steps} zooms of 4x, {per * 1000:.0f} ms per zoom (server round trip)")
        page.close()
    finally:
        server.shutdown()
        server.server_close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--serve-events", type=int, default=0, help="also serve a run of N events (e.g. 10000000)")
    ap.add_argument("--no-torch", action="store_true", help="skip torch's trace_plot comparison")
    args = ap.parse_args()
    from memtrace.store import save_trace
    from playwright.sync_api import sync_playwright

    trace = build(args.events)
    n = len(trace.events)
    print(f"built      {n:,} events, {len(trace.stacks):,} stacks, {len(trace.samples):,} samples")
    with tempfile.TemporaryDirectory() as tmp_name, sync_playwright() as p:
        tmp = Path(tmp_name)
        path = tmp / "bench.memtrace"
        save_trace(trace, path)
        del trace
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        bench_page(browser, path, tmp, n)
        if not args.no_torch:
            torch_offline(browser, bench_torch(path, tmp, n))
        if args.serve_events:
            bench_serve(browser, args.serve_events, tmp)
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
