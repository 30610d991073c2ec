"""Probe: what the first allocator-history snapshot of a process costs, and where (device machine).

On the H200 the first drain of a process took ~5 s once (later drains: ms). This prints the time of
the first and second ``_snapshot()`` and of the re-enable with ``clear_history``, for each stack mode,
in a fresh process each, with a cProfile of the first snapshot and the modules it imported.

    python tests/gpu/probe_first_snapshot.py
"""

from __future__ import annotations

import os
import subprocess
import sys

CHILD = r"""
import cProfile, io, os, pstats, sys, time
import torch
ctx, stacks = sys.argv[1], sys.argv[2]
ctx = None if ctx == "none" else ctx
torch.zeros(1, device="cuda")
torch.cuda.memory._record_memory_history(enabled="all", context=ctx, stacks=stacks, max_entries=200000)
keep = [torch.empty(1 << 20, device="cuda") for _ in range(100)]
mods = set(sys.modules)
pr = cProfile.Profile()
t0 = time.perf_counter(); pr.enable(); s = torch.cuda.memory._snapshot(); pr.disable(); t1 = time.perf_counter()
torch.cuda.memory._record_memory_history(enabled="all", context=ctx, stacks=stacks, max_entries=200000, clear_history=True)
t2 = time.perf_counter()
keep += [torch.empty(1 << 20, device="cuda") for _ in range(100)]
t3 = time.perf_counter(); s2 = torch.cuda.memory._snapshot(); t4 = time.perf_counter()
print(f"context={ctx} stacks={stacks} env={os.environ.get('TORCH_SYMBOLIZE_MODE')}: first snapshot {t1-t0:.3f} s "
      f"({len(s['device_traces'][0])} entries), clear {t2-t1:.3f} s, second snapshot {t4-t3:.3f} s")
print("  new modules:", sorted(set(sys.modules) - mods)[:20])
out = io.StringIO(); pstats.Stats(pr, stream=out).sort_stats("cumulative").print_stats(6); print(out.getvalue()[-1500:])
"""

for ctx, stacks, env in [
    ("all", "python", None),
    ("none", "python", None),
    ("all", "python", "fast"),
    ("all", "python", "dladdr"),
]:
    e = dict(os.environ)
    if env:
        e["TORCH_SYMBOLIZE_MODE"] = env
    subprocess.run([sys.executable, "-c", CHILD, ctx, stacks], env=e, timeout=120)
