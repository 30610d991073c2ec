"""On the H200 with torch 2.14: python3 tests/gpu/record_annotations.py OUT; writes OUT/annotated.pickle (every
user annotation torch has) and OUT/prof/ as vLLM's profiler names it; prints what torch actually recorded."""

import collections
import pickle
import sys
from pathlib import Path

import torch

out, mem = Path(sys.argv[1]), torch.cuda.memory
(out / "prof").mkdir(parents=True, exist_ok=True)
mem._record_memory_history(enabled="all", stacks="python", global_record_annotations=True)
for step in range(2):
    mem._set_memory_metadata(f"step={step}")  # user_metadata on every entry made while set
    with torch.profiler.record_function(f"step_{step}"):  # external_annotations START/END
        x = torch.randn(1024, 1024, device="cuda") @ torch.randn(1024, 1024, device="cuda")
    if hasattr(mem, "_annotate_tensor"):  # a note on a live tensor, where this build has it
        mem._annotate_tensor(x, f"result of step {step}")
mem._set_memory_metadata("")
mem._dump_snapshot(str(out / "annotated.pickle"))
mem._record_memory_history(enabled=None)
handler = torch.profiler.tensorboard_trace_handler(str(out / "prof"), "dp0_pp0_tp0_dcp0_ep0_rank0", use_gzip=True)
with torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True, on_trace_ready=handler):
    y = torch.randn(2048, 2048, device="cuda") @ torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
snap = pickle.load(open(out / "annotated.pickle", "rb"))
entries = [e for d in snap["device_traces"] for e in d]
print(torch.__version__, "API:", [n for n in dir(mem) if "annot" in n or "metadata" in n])
print(collections.Counter(e["action"] for e in entries), collections.Counter(e.get("user_metadata") for e in entries))
print(
    len(snap.get("external_annotations", [])), "external annotations;", sorted(p.name for p in (out / "prof").iterdir())
)
