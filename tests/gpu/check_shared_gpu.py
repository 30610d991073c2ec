"""GPU check: another process's memory on the traced device is attributed to "others", not to us.

Run on the GPU machine:  python tests/gpu/check_shared_gpu.py [--hold-gib 16]

A child process (torch) holds ``--hold-gib`` GiB on the device; this process then records a small
workload with memtrace. The trace must show the child's memory as the other-processes series (about
the held bytes plus the child's CUDA context), and this process's device used / non-PyTorch memory
without it. Prints one JSON line of figures, then PASS or FAIL with the reasons (exit code 0 / 1).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time

GiB = 1 << 30

HOLDER = textwrap.dedent(
    """
    import sys, torch
    x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("held", flush=True)
    sys.stdin.readline()
    """
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold-gib", type=float, default=16.0)
    args = parser.parse_args(argv)
    hold = int(args.hold_gib * GiB)
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(hold)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"held", "the holder process failed"
        return _record_and_check(hold, child.pid)
    finally:
        child.stdin.close()
        child.wait(timeout=60)


def _record_and_check(hold: int, child_pid: int) -> int:
    import memtrace
    import torch
    import torch._inductor  # noqa: F401  (vLLM imports it; memtrace.start() would, for the stack symbolizer)
    from memtrace.analysis.analysed.run import analyse
    from memtrace.analysis.memory.curves import all_curves
    from memtrace.store import load_trace

    torch.cuda.init()
    torch.empty(1, device="cuda")  # our CUDA context exists before recording, as in a vLLM worker
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        session = memtrace.start(d)
        start_s = time.perf_counter() - t0
        time.sleep(1.5)  # the sidecar starts without being waited for
        with memtrace.phase("work"):
            x = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            time.sleep(0.5)
            del x
        torch.cuda.synchronize()
        time.sleep(0.2)
        memtrace.stop()
        trace = load_trace(session.path)
    curves = all_curves(trace)
    side = trace.facts.get("sidecar") or {}
    summary = analyse([trace]).ranks[0]
    figures = {
        "start_s": round(start_s, 3),
        "child_pid": child_pid,
        "others_method": side.get("others_method"),
        "others_methods": side.get("others_methods"),
        "traced_pids": side.get("traced_pids"),
        "memory_matched_pid": side.get("memory_matched_pid"),
        "nvml_pids": side.get("nvml_pids"),
        "samples": len(trace.samples),
        "others_samples": len(trace.others),
        "others_min_gib": round(int(curves.others.bytes.min()) / GiB, 3) if len(curves.others) else None,
        "others_max_gib": round(int(curves.others.bytes.max()) / GiB, 3) if len(curves.others) else None,
        "device_used_peak_gib": round(curves.device_used.peak_bytes / GiB, 3),
        "reserved_peak_gib": round(curves.reserved.peak_bytes / GiB, 3),
        "non_torch_at_peak_gib": round((summary.peak.non_torch_bytes or 0) / GiB, 3),
    }
    print(json.dumps(figures))
    failures = []
    if side.get("others_method") not in ("per-process", "used-minus-ours"):
        failures.append(f"others not attributed (method {side.get('others_method')!r})")
    elif not (hold <= curves.others.bytes.min() and curves.others.bytes.max() <= hold + 2 * GiB):
        failures.append("the others series is not the held bytes plus a CUDA context")
    if curves.device_used.peak_bytes > curves.reserved.peak_bytes + 2 * GiB:
        failures.append("this process's device used still includes the other process")
    if not 0 <= (summary.peak.non_torch_bytes or 0) < 2 * GiB:
        failures.append("non-PyTorch memory at the peak is not this process's CUDA context")
    print("PASS" if not failures else "FAIL: " + "; ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
