"""Speed of the gate commands on a SYNTHETIC 1M-event trace: diff, fits, Perfetto and memory_viz export.

Prints figures; asserts nothing (speed goals are read, not tested). Run:
    python tests/bench/bench_gates.py [N_EVENTS]
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("synthetic_startup", TESTS / "synthetic_startup.py")
synthetic = importlib.util.module_from_spec(spec)
sys.modules["synthetic_startup"] = synthetic
spec.loader.exec_module(synthetic)

from capacity_model import fit  # noqa: E402
from memtrace.analysis.analysed.run import analyse  # noqa: E402
from memtrace.plots.memory_viz import export_memory_viz  # noqa: E402
from memtrace.plots.perfetto import export_perfetto  # noqa: E402
from memtrace.units import GiB, parse_threshold  # noqa: E402
from references import diff_traces  # noqa: E402


def timed(label: str, fn) -> None:
    t0 = time.perf_counter()
    fn()
    print(f"{label:<28} {time.perf_counter() - t0:6.2f} s")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    trace = synthetic.synthetic_large(n)
    print(f"SYNTHETIC trace: {len(trace.events):,} events, {len(trace.samples):,} NVML samples")
    with tempfile.TemporaryDirectory() as d:
        timed("diff (self vs self)", lambda: diff_traces(trace, trace, parse_threshold("2%")))
        timed("fits (3 capacities)", lambda: [fit(trace, c) for c in (16 * GiB, 32 * GiB, 48 * GiB)])
        timed("export perfetto", lambda: export_perfetto(analyse([trace]), Path(d) / "t.json"))
        timed("export memory-viz", lambda: export_memory_viz(trace, Path(d) / "t.pickle"))
        for name in ("t.json", "t.pickle"):
            print(f"{name:<28} {os.path.getsize(Path(d) / name) / 1e6:6.1f} MB")


if __name__ == "__main__":
    main()
