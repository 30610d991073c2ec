"""Record the CPU Kineto trace shipped as tests/data/snapshots/cpu-mlp.pt.trace.json.gz (torch CPU)."""

import gzip
import shutil

import torch
from torch.profiler import ProfilerActivity, profile, record_function

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 128))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 512)
with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
    for _step in range(2):
        with record_function("memtrace:forward"):
            loss = model(x).square().mean()
        with record_function("memtrace:backward"):
            loss.backward()
        with record_function("memtrace:step"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        del loss
prof.export_chrome_trace("cpu-mlp.pt.trace.json")
with open("cpu-mlp.pt.trace.json", "rb") as f, gzip.open("cpu-mlp.pt.trace.json.gz", "wb", 9) as g:
    shutil.copyfileobj(f, g)
