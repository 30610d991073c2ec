"""PyTorch allocated is two things (issue 32, defect 12): requested bytes and torch's blocks. The blocks'
curve equals ``torch.cuda.memory_allocated()`` read by the plugin at every phase edge of the real vLLM
start-ups recorded on the H200 (vLLM 0.33 and 0.34)."""

from __future__ import annotations

import numpy as np
import pytest
from memtrace import facts as F
from memtrace.analysis.memory.blocks import block_curve, block_sizes, round_size
from memtrace.analysis.memory.curves import all_curves
from memtrace.model import ACTION_CODE
from memtrace.store import load_run
from vllm034_data import STEPS, VLLM033, run_dir


def _readings(trace):
    return [r for r in trace.facts.get(F.PHASE_MEMORY) or [] if isinstance(r.get("allocated_bytes"), int)]


RUNS = [("0.34", s) for s in STEPS] + [("0.33", "moe")]


@pytest.mark.parametrize(("version", "step"), RUNS, ids=lambda x: x)
def test_the_blocks_curve_equals_torchs_memory_allocated_at_every_phase_edge(version, step):
    trace = load_run(run_dir(step) if version == "0.34" else VLLM033.run_dir(step)).traces[0]
    curves = all_curves(trace)
    blocks = block_curve(trace, curves)
    readings = _readings(trace)
    assert len(readings) >= 19
    assert [blocks.at(int(r["time_us"])) for r in readings] == [r["allocated_bytes"] for r in readings]
    # the requested bytes are below it: both exact, they count different things
    assert all(curves.allocated.at(int(r["time_us"])) < r["allocated_bytes"] for r in readings)


def test_the_one_mib_step_of_load_model_is_a_block_torch_did_not_split():
    trace = load_run(run_dir("moe-ext")).traces[0]
    ev = trace.events
    allocs = np.flatnonzero(ev["action"] == ACTION_CODE["alloc"])
    extra = block_sizes(trace)[allocs] - round_size(ev["size"][allocs])
    whole = allocs[extra > 0]
    assert len(whole) >= 1 and 0 < int(extra[extra > 0].max()) <= 1 << 20  # the rest of its block (<= 1 MiB)
    # before it, the blocks' counter and torch's differed by the baseline alone; the readings now agree (above)
    readings = {(r["phase"], r["edge"]): r["allocated_bytes"] for r in _readings(trace)}
    grew = readings[("load_model", "end")] - readings[("load_model", "start")]
    curves = all_curves(trace)
    t0, t1 = (int(r["time_us"]) for r in _readings(trace) if r["phase"] == "load_model")
    assert grew - (curves.allocated.at(t1) - curves.allocated.at(t0)) == 1_074_396 - 3_324  # the 1 MiB step + rounding
