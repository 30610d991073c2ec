"""The flame graph with CUPTI's records (issue #15) on the real vLLM 0.25.1 start-up on the H200
(tests/data/vllm-h200/startup-cupti): the non-PyTorch device memory CUPTI saw live sits under its own
frame, its parts add up to the breakdown's ``cupti_bytes`` and PyTorch's to the allocated bytes, to
the byte; a trace without CUPTI records draws exactly what it drew before."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from memtrace.analysis.holders.flame import NO_STACK, NON_TORCH, PHASE_PREFIX, flame_at
from memtrace.analysis.memory import non_torch
from memtrace.analysis.memory.curves import all_curves
from memtrace.cli import main
from memtrace.model import empty_device_allocs
from memtrace.plots.flame_svg import render_flame_svg
from memtrace.plots.folded import folded_lines, render_folded
from memtrace.store import load_trace
from references import peak_event_index
from testdata import unpacked

DATA = Path(__file__).parents[1] / "data" / "vllm-h200"
RUN = unpacked(DATA / "startup-cupti")
SVG = "{http://www.w3.org/2000/svg}"
OTHER, STATICS = f"[{non_torch.OTHER}]", f"[{non_torch.MODULES}]"
CALL_947 = "call (u3/cu3svbzqvt7ri5nuodhjv3gvdgpsuamhai3ep62kw5cs3ozoovof.py:947)"


@pytest.fixture(scope="module")
def trace():
    return load_trace(RUN / "vm-pid1909-rank0.memtrace")


@pytest.fixture(scope="module")
def peak(trace):
    curves = all_curves(trace)
    k = peak_event_index(curves.allocated, curves.reserved)
    return k, int(curves.allocated.bytes[k + 1]), flame_at(trace, event_index=k, non_torch=True)


def _folded_sum(lines: list[str], non_pytorch: bool) -> int:
    return sum(int(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(NON_TORCH + ";") == non_pytorch)


def test_the_peak_holds_pytorchs_allocated_bytes_and_the_non_pytorch_bytes_cupti_saw(trace, peak):
    k, allocated, flame = peak
    b = non_torch.breakdown(trace, flame.time_us, "peak", curves=all_curves(trace))
    assert b.cupti_bytes == 68_362_212
    assert flame.torch_bytes == allocated == 137_870_244_340
    assert flame.non_torch_bytes == b.cupti_bytes
    assert flame.total_bytes == allocated + b.cupti_bytes == 137_938_606_552
    part = flame.root.children[NON_TORCH]
    assert (part.total_bytes, part.count) == (68_362_212, 3 + 1_483)
    cats = {c.name: (c.total_bytes, c.count) for c in part.sorted_children()}
    assert cats == {OTHER: (67_240_960, 3), STATICS: (1_121_252, 1_483)}
    # every category of the breakdown, to the byte
    assert {f"[{c.name}]": c.bytes for c in b.categories if c.name != non_torch.UNEXPLAINED} == {
        name: nbytes for name, (nbytes, _) in cats.items()
    }


def test_folded_lines_add_up_to_allocated_and_to_cuptis_bytes(trace, peak, tmp_path):
    _, allocated, flame = peak
    lines = folded_lines(flame)
    assert _folded_sum(lines, non_pytorch=False) == allocated
    assert _folded_sum(lines, non_pytorch=True) == flame.non_torch_bytes == 68_362_212
    out = render_folded(flame, tmp_path / "peak.folded")
    assert out.read_text().count(NON_TORCH + ";") == 4  # one stack of 3 raw cudaMallocs, statics in 3 phases


def test_the_64_mib_allocation_sits_under_the_torch_compile_graph_frame(peak):
    _, _, flame = peak
    (path, nbytes), *_ = sorted(((p, n) for p, n in flame.stacks.items() if p[0] == NON_TORCH), key=lambda kv: -kv[1])
    assert nbytes == 64 * 2**20 + 128 * 2**10 + 2**10  # 64 MiB + 128 KiB + 1 KiB, one stack
    assert path[:3] == (NON_TORCH, OTHER, "<module> (<string>:1)")  # the Python stack, outermost first
    assert "profile_run (vllm/v1/worker/gpu_model_runner.py:6350)" in path
    assert CALL_947 in path and path.index(CALL_947) > path.index(
        "profile_run (vllm/v1/worker/gpu_model_runner.py:6350)"
    )
    assert not any("memtrace/plugins/hooks.py" in f for f in path)  # the tracer's wrappers are dropped
    assert path[-1] == "__call__ (torch/_ops.py:865)"


def test_records_without_a_stack_sit_under_no_stack_and_their_phase(peak):
    _, _, flame = peak
    statics = {p[3]: n for p, n in flame.stacks.items() if p[:3] == (NON_TORCH, STATICS, NO_STACK)}
    assert statics == {
        f"{PHASE_PREFIX}load_model": 222_159,
        f"{PHASE_PREFIX}determine_available_memory/profile_run": 898_985,
        f"{PHASE_PREFIX}determine_available_memory/cudagraph_profile": 108,
    }


def test_live_allocations_are_the_breakdowns_and_the_live_curves_at_every_moment(trace):
    curve, allocated = non_torch.live_curve(trace), all_curves(trace).allocated
    for t in [int(x) for x in curve.time_us[:: max(len(curve) // 12, 1)]] + [int(curve.time_us[-1])]:
        live = non_torch.live_allocations(trace, t)
        b = non_torch.breakdown(trace, t, "t", curves=all_curves(trace))
        assert sum(a.bytes for a in live) == b.cupti_bytes == curve.at(t)
        flame = flame_at(trace, t, non_torch=True)
        assert (flame.non_torch_bytes, flame.torch_bytes) == (b.cupti_bytes, allocated.at(t))
        assert flame.total_bytes == allocated.at(t) + b.cupti_bytes


def test_since_keeps_only_what_cupti_saw_allocated_from_then_on(trace):
    profile = next(p for p in trace.phases if p.name == "profile_run")
    at = profile.end_us - 1
    added = flame_at(trace, at, since_us=profile.start_us, non_torch=True)
    live = non_torch.live_allocations(trace, at)
    assert added.non_torch_bytes == sum(a.bytes for a in live if a.time_us >= profile.start_us)
    # the compiled graph's 64 MiB + 128 KiB + 1 KiB and the statics of the kernels profile_run loaded
    assert added.non_torch_bytes == 67_240_960 + 898_985
    assert added.torch_bytes == flame_at(trace, at, since_us=profile.start_us).total_bytes


def test_svg_names_both_parts_and_draws_the_narrow_one_again_at_its_own_scale(peak, tmp_path):
    _, _, flame = peak
    drawn = render_flame_svg(flame, tmp_path / "f.svg", title="t", subtitle="s")
    assert drawn.total_bytes == flame.total_bytes and drawn.non_torch_panel
    root = ET.parse(tmp_path / "f.svg").getroot()
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert "shown: PyTorch 128.40 GiB + non-PyTorch (CUPTI) 65.20 MiB" in " ".join(texts)
    assert any(t.startswith("all live memory: 128.47 GiB = PyTorch 128.40 GiB + non-PyTorch (CUPTI)") for t in texts)
    assert any("at its own scale: 65.20 MiB" in t for t in texts)
    boxes = {}
    for g in root.iter(f"{SVG}g"):
        title, rect = g.find(f"{SVG}title"), g.find(f"{SVG}rect")
        name = title.text.split("\n")[0]
        boxes[name] = max(boxes.get(name, 0.0), float(rect.get("width")))
    # in the panel the non-PyTorch frame spans the width and the compiled graph's frame is readable
    assert boxes[NON_TORCH] == pytest.approx(1180, abs=0.01)
    assert boxes[CALL_947] == pytest.approx(1180 * 67_240_960 / 68_362_212, abs=0.01)
    assert f"{CALL_947} · 64.13 MiB" in texts  # labelled in full, with its bytes


def test_a_trace_without_records_draws_what_it_drew_before(trace, peak, tmp_path):
    k, _, flame = peak
    bare = dataclasses.replace(trace, device_allocs=empty_device_allocs())
    assert not non_torch.has_records(bare) and non_torch.live_allocations(bare, flame.time_us) == []
    before = flame_at(trace, event_index=k)  # PyTorch's allocations alone, as flame_at always drew
    after = flame_at(bare, event_index=k, non_torch=True)
    assert after.non_torch_bytes is None and after.stacks == before.stacks and after == before
    render_flame_svg(before, tmp_path / "before.svg", title="t", subtitle="s")
    render_flame_svg(after, tmp_path / "after.svg", title="t", subtitle="s")
    assert (tmp_path / "after.svg").read_bytes() == (tmp_path / "before.svg").read_bytes()
    assert "CUPTI" not in (tmp_path / "after.svg").read_text()


def test_cli_draws_cuptis_part_by_default_and_leaves_it_out_with_torch_only(tmp_path, capsys):
    both, torch_only = tmp_path / "both.folded", tmp_path / "torch.folded"
    assert main(["flame", str(RUN), "-o", str(both)]) == 0
    assert "(PyTorch 128.40 GiB + non-PyTorch 65.20 MiB CUPTI saw) live at the reserved peak" in capsys.readouterr().err
    assert main(["flame", str(RUN), "--torch-only", "-o", str(torch_only)]) == 0
    lines, plain = both.read_text().splitlines(), torch_only.read_text().splitlines()
    assert _folded_sum(lines, non_pytorch=True) == 68_362_212
    assert [x for x in lines if not x.startswith(NON_TORCH)] == plain and NON_TORCH not in torch_only.read_text()
    assert main(["flame", str(unpacked(DATA / "startup")), "-o", str(tmp_path / "a.folded")]) == 0
    assert main(["flame", str(unpacked(DATA / "startup")), "--torch-only", "-o", str(tmp_path / "b.folded")]) == 0
    assert (tmp_path / "a.folded").read_bytes() == (tmp_path / "b.folded").read_bytes()
