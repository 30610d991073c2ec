"""Render the README's picture of ``memtrace view`` (``docs/view.png``) from the real run it shows.

    python examples/render_view.py --out /tmp/view.png            # the picture, from its source
    python examples/render_view.py --out docs/view.png --force     # docs/ as the README shows it

The page is ``memtrace view tests/data/h200/startup-cap16g`` (the start-up recorded on the H200 held to a 16
GiB card, which dies of CUDA OOM in kernel_warmup), opened in Debian's Chromium through Playwright (no browser
download; ``MEMTRACE_CHROMIUM`` names another binary), zoomed onto the last 37 ms before the OOM and clicked
at 7.035 s, so the panel under the chart says what was live at that moment.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "tests" / "data" / "h200" / "startup-cap16g"
CHROMIUM = os.environ.get("MEMTRACE_CHROMIUM", "/usr/bin/chromium")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--force", action="store_true", help="overwrite --out")
    ap.add_argument("--zoom", default="7.015,7.0518", help="seconds x0,x1 to zoom onto")
    ap.add_argument("--click", type=float, default=7.035, help="the moment (s) clicked")
    args = ap.parse_args(argv)
    if args.out.exists() and not args.force:
        print(f"{args.out} exists; pass --force to overwrite it", file=sys.stderr)
        return 2
    from memtrace.cli import main as memtrace
    from playwright.sync_api import sync_playwright

    x0, x1 = (float(x) for x in args.zoom.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "view.html"
        if memtrace(["view", str(RUN), "-o", str(html)]) != 0:
            return 1
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 870})
            page.goto(html.as_uri())
            page.wait_for_function("window.memtraceView && memtraceView.ready")
            page.evaluate(f"memtraceView.zoom({x0!r}, {x1!r})")
            page.wait_for_function(f"memtraceView.ranks.every(r => r.view && Math.abs(r.view.x0 - {x0!r}) < 1e-9)")
            box = page.evaluate("(() => { const b = memtraceView.ranks[0].u.over.getBoundingClientRect(); "
                                "return {x: b.x, y: b.y, h: b.height}; })()")  # fmt: skip
            x = page.evaluate(f"memtraceView.ranks[0].u.valToPos({args.click!r}, 'x')") + box["x"]
            page.mouse.click(x, box["y"] + box["h"] / 2)
            page.wait_for_timeout(300)
            errors = page.evaluate("memtraceView.errors")
            page.screenshot(path=str(args.out))
            browser.close()
    if errors:
        print(f"the page reported errors: {errors}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
