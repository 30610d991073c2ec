"""The view's sizes follow the reports' one unit rule (``memtrace.units``): ``plots/assets/view_units.js`` is its
port, run under node here and held to Python's text on a list of byte values, the small ones a CPU profiler
trace holds ("9.24 KiB"), rounding ties, signs and the GiB-sized figures of a GPU start-up."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources

import pytest
from memtrace import units

#: bytes around every boundary of the rule: zero, bytes, KiB, the 0.005 GiB edge, ties, GiB and TiB
VALUES = [0, 1, 4, 512, 1023, 1024, 1536, 9_460, 8_436, 1 << 20, 3 * (1 << 20) // 2, 5_368_709, 5_368_710,
          5_368_709 * 2, 10_737_418, 10_737_419, 134_217_728, 161_061_273, 1 << 30, 11_842_613_248,
          11_882_463_232, 150_109_880_320, 1 << 40, 3 << 40, -4, -9_460, -(1 << 20), -11_842_613_248]  # fmt: skip
PYTHON = {
    "formatGib": units.format_gib,
    "gibNumber": units.gib_number,
    "signedGib": units.signed_gib,
    "formatSize": units.format_size,
    "formatBytes": units.format_bytes,
    "axisUnit": lambda b: list(units.axis_unit(b)),  # the chart's y unit, as the PNG timeline's
}


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_page_prints_every_size_as_the_reports_do(tmp_path):
    js = resources.files("memtrace.plots").joinpath("assets", "view_units.js")
    script = (f"const U = require({json.dumps(str(js))}); const v = {json.dumps(VALUES)};"
              f"console.log(JSON.stringify(Object.fromEntries({json.dumps(list(PYTHON))}.map((f) => [f, v.map((b) => U[f](b))]))));")  # fmt: skip
    got = json.loads(subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True).stdout)
    want = {name: [fn(b) for b in VALUES] for name, fn in PYTHON.items()}
    assert got == want
    assert got["formatGib"][VALUES.index(9_460)] == "9.24 KiB"  # tp1's CPU peak, never "0.00 GiB"
    assert got["formatGib"][VALUES.index(134_217_728)] == "0.12 GiB"  # a tie: to the even digit, as Python
