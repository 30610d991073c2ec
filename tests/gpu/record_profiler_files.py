#!/usr/bin/env python3
"""Record, on a real GPU, the files users already have (issue 29): a torch.profiler Kineto trace with
memory events, the allocator snapshot with history of the same steps, a state-only snapshot (history
off), one with expandable segments, and `export_memory_timeline`'s output.

    python3 tests/gpu/record_profiler_files.py OUTDIR            # on the device; ~20 s

A small transformer trains for a few steps under
`torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)` while PyTorch's
allocator history is on (`_record_memory_history(enabled="all", stacks="python")`, with
`global_record_annotations` / `compile_context` where this torch has them), so the Kineto trace's
`[memory]` events and the snapshot's trace entries describe the same allocations. Each file's
provenance (torch, GPU, what was asked) goes to OUTDIR/README.txt.
"""

import gzip
import inspect
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, record_function

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "profiler-files")
OUT.mkdir(parents=True, exist_ok=True)
notes: list[str] = []


def note(msg: str) -> None:
    print(msg, flush=True)
    notes.append(msg)


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d, 8, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x):
        h = self.n1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.n2(x))


def model(d: int = 512, layers: int = 4) -> nn.Module:
    return nn.Sequential(*[Block(d) for _ in range(layers)]).cuda()


def history_kwargs() -> dict:
    """The optional arguments this torch's `_record_memory_history` accepts, switched on."""
    sig = inspect.signature(torch.cuda.memory._record_memory_history)
    want = {"compile_context": True, "global_record_annotations": True, "record_pinned_host_memory": True}
    got = {k: v for k, v in want.items() if k in sig.parameters}
    note(f"_record_memory_history parameters: {list(sig.parameters)}; switched on: {sorted(got)}")
    return got


def train_steps(net: nn.Module, steps: int, tokens: int = 256, batch: int = 8) -> None:
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    pinned = torch.empty(4 << 20, dtype=torch.uint8, pin_memory=True)  # pinned host memory, 4 MiB
    for i in range(steps):
        if hasattr(torch.cuda.memory, "_set_memory_metadata"):
            torch.cuda.memory._set_memory_metadata(f"step={i}")
        with record_function(f"step_{i}"):
            x = torch.randn(batch, tokens, 512, device="cuda")
            with record_function("forward"):
                loss = net(x).float().pow(2).mean()
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        pinned[: 1 << 20].copy_(x.flatten()[: 1 << 18].view(torch.uint8))  # device -> pinned host
    if hasattr(torch.cuda.memory, "_set_memory_metadata"):
        torch.cuda.memory._set_memory_metadata("")
    torch.cuda.synchronize()


def kineto_with_history() -> None:
    net = model()
    torch.cuda.memory._record_memory_history(enabled="all", stacks="python", **history_kwargs())
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        profile_memory=True,
        record_shapes=True,
        with_stack=True,
    ) as prof:
        train_steps(net, steps=3)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(OUT / "history.pickle", "wb") as f:
        pickle.dump(snap, f)
    traces = snap.get("device_traces", [[]])
    note(
        f"history.pickle: {sum(len(t) for t in traces)} trace entries, {len(snap.get('segments', []))} segments, "
        f"actions {sorted({e['action'] for t in traces for e in t})}, keys {sorted(snap)}"
    )
    raw = OUT / "kineto.pt.trace.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(str(raw) + ".gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    doc = json.load(open(raw))
    mem = [e for e in doc.get("traceEvents", []) if e.get("name") == "[memory]"]
    note(f"kineto.pt.trace.json.gz: {len(doc.get('traceEvents', []))} events, {len(mem)} [memory] events")
    raw.unlink()
    try:
        prof.export_memory_timeline(str(OUT / "memory_timeline.raw.json.gz"), device="cuda:0")
        note("memory_timeline.raw.json.gz: export_memory_timeline(device='cuda:0')")
    except Exception as e:  # deprecated in torch 2.14; say why it is missing
        note(f"export_memory_timeline failed: {type(e).__name__}: {e}")


def state_only() -> None:
    """`_snapshot()` with history never switched on: allocator state, no trace entries."""
    code = (
        "import pickle, sys, torch\n"
        "x = [torch.empty(n << 20, dtype=torch.uint8, device='cuda') for n in (1, 3, 8, 21, 64)]\n"
        "del x[1]\n"
        "y = torch.randn(1024, 1024, device='cuda') @ torch.randn(1024, 1024, device='cuda')\n"
        "torch.cuda.synchronize()\n"
        "s = torch.cuda.memory._snapshot()\n"
        "s['_memtrace_counters'] = {'allocated': torch.cuda.memory_allocated(), 'reserved': torch.cuda.memory_reserved()}\n"
        "pickle.dump(s, open(sys.argv[1], 'wb'))\n"
        "print(len(s['segments']), 'segments', sum(len(t) for t in s['device_traces']), 'trace entries', s['_memtrace_counters'])\n"
    )
    for name, conf in (("state-only.pickle", ""), ("state-only-expandable.pickle", "expandable_segments:True")):
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf) if conf else dict(os.environ)
        r = subprocess.run([sys.executable, "-c", code, str(OUT / name)], env=env, capture_output=True, text=True)
        note(f"{name} (PYTORCH_CUDA_ALLOC_CONF={conf!r}): {r.stdout.strip()} {r.stderr.strip()[-300:]}")


def main() -> None:
    t0 = time.time()
    note(
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, python {sys.version.split()[0]}"
    )
    kineto_with_history()
    state_only()
    note(f"done in {time.time() - t0:.1f} s")
    (OUT / "README.txt").write_text("\n".join(notes) + "\n")


if __name__ == "__main__":
    main()
