"""The KV cache vLLM 0.34 commits through CUDA's VMM API, outside PyTorch, in every graphical output (issue 20).

On the real H200 start-ups of tests/data/vllm-h200-034 the extensible KV cache (126 GiB on moe-ext, while
PyTorch reserved peaks at 11.7 GiB) never passes through PyTorch's allocator: the timeline draws it as a band
on top of PyTorch reserved, the flame graph and folded stacks give it a root of its own, Perfetto a counter,
the view a series. Each figure is compared with ``rank.vmm.kv_cache_bytes`` (the plugin's exact records);
the 0.25.1 start-up of tests/data/vllm-h200/startup shows none of it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from memtrace.analysis.analysed.rank import TargetSpec
from memtrace.analysis.analysed.run import analyse
from memtrace.plots.palette import VMM_KV_LABEL
from memtrace.plots.timeline import render_timeline
from memtrace.plots.timeline_data import prepare_rank, vmm_band
from memtrace.store import load_run
from testdata import unpacked
from vllm034_data import run_dir

TESTS = Path(__file__).resolve().parents[1]
OLD = unpacked(TESTS / "data" / "vllm-h200" / "startup")  # vLLM 0.25.1: no VMM
MOE_KV_BYTES = 135_543_128_064  # what the plugin recorded vLLM committing (tests/data/vllm-h200-034/README.md)
EXT = ("moe-ext", "dense-ext", "small-ext")

_RUNS: dict = {}


def _run(step: str):
    if step not in _RUNS:
        path = OLD if step == "old" else run_dir(step)
        _RUNS[step] = analyse(load_run(path).traces, TargetSpec())
    return _RUNS[step]


def test_moe_ext_commits_126_gib_outside_pytorch():
    rank = _run("moe-ext").ranks[0]
    assert rank.vmm.kv_cache_bytes == MOE_KV_BYTES
    assert rank.curves.reserved.peak_bytes < 12 * 2**30


# --- the timeline -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", EXT)
def test_the_timelines_vmm_band_ends_at_the_kv_cache_committed(step):
    rank = _run(step).ranks[0]
    tl = prepare_rank(rank)
    band = vmm_band(tl, tl.start_us, tl.end_us, 2400)
    assert band is not None
    assert int(band.kv_bytes[-1]) == rank.vmm.kv_cache_bytes
    assert int(band.kv_bytes.max()) == rank.vmm.kv_cache_peak_bytes
    # stacked on PyTorch reserved: its floor is the reserved curve's value in force
    assert int(band.reserved_bytes[-1]) == rank.curves.reserved.at(tl.end_us)
    assert (band.kv_bytes >= 0).all()


def test_the_moe_ext_band_is_the_vmm_curve_at_every_step():
    rank = _run("moe-ext").ranks[0]
    tl = prepare_rank(rank)
    band = vmm_band(tl, tl.start_us, tl.end_us, 2400)
    assert set(rank.vmm_kv.time_us.tolist()) <= set(band.time_us.tolist())
    assert (band.kv_bytes == rank.vmm_kv.at_each(band.time_us)).all()


@pytest.mark.parametrize("step", EXT)
def test_the_timeline_names_the_vmm_band_and_zooms_on_it(step, tmp_path):
    run = _run(step)
    tl = prepare_rank(run.ranks[0])
    drawn = render_timeline([tl], tmp_path / "t.svg", t0_us=run.origin.t0_us)
    assert VMM_KV_LABEL in drawn.legend
    assert "non-PyTorch (NVML used - reserved - VMM)" in drawn.legend
    kv = run.ranks[0].vmm_kv
    lo, hi = drawn.ranks[0].zoom_us
    assert lo <= int(kv.time_us[kv.peak_index]) <= hi  # the commit, a few ms wide, is in the zoom
    svg = (tmp_path / "t.svg").read_text()
    assert 'id="vmm_kv' in svg
    assert "KV cache committed through CUDA VMM" in svg


def test_a_timeline_before_034_has_no_vmm_band(tmp_path):
    run = _run("old")
    tl = prepare_rank(run.ranks[0])
    assert tl.vmm_kv is None
    assert vmm_band(tl, tl.start_us, tl.end_us, 2400) is None
    drawn = render_timeline([tl], tmp_path / "t.svg", t0_us=run.origin.t0_us)
    assert VMM_KV_LABEL not in drawn.legend
    assert "non-PyTorch (NVML used - reserved)" in drawn.legend
    assert "VMM" not in (tmp_path / "t.svg").read_text()


# --- the flame graph and folded stacks -----------------------------------------------------------------------


def _at_end(run) -> str:
    rank = run.ranks[0]
    return f"{rank.seconds(rank.span[1]):.6f}s"


def test_the_folded_stacks_at_the_end_of_moe_ext_hold_the_vmm_kv_cache_under_its_own_root(tmp_path):
    from memtrace.analysis.holders.flame import VMM_KV
    from memtrace.plots.render import render

    run = _run("moe-ext")
    out = tmp_path / "end.folded"
    render(run, out, "folded", at=_at_end(run))
    lines = out.read_text().splitlines()
    vmm = [int(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(VMM_KV + ";")]
    assert sum(vmm) == MOE_KV_BYTES == run.ranks[0].vmm.kv_cache_bytes
    # under the Python stack that committed it: vLLM's extensible KV cache mapping its chunks
    assert any("_map_chunk_at (vllm/utils/extensible_tensor.py" in line for line in lines if line.startswith(VMM_KV))
    total = sum(int(line.rsplit(" ", 1)[1]) for line in lines)
    rank = run.ranks[0]
    assert total == rank.curves.allocated.at(rank.span[1]) + MOE_KV_BYTES


@pytest.mark.parametrize("step", EXT)
def test_the_flame_at_the_end_splits_pytorch_and_the_vmm_kv_cache(step):
    from memtrace.analysis.holders.flame import VMM_KV
    from memtrace.analysis.holders.moment import flame_for

    run = _run(step)
    rank = run.ranks[0]
    _, flame = flame_for(rank, _at_end(run))
    assert flame.vmm_bytes == rank.vmm_kv.at(flame.time_us) == rank.vmm.kv_cache_bytes
    assert flame.root.children[VMM_KV].total_bytes == flame.vmm_bytes
    assert flame.total_bytes == flame.torch_bytes + flame.vmm_bytes
    # --torch-only leaves it out, as CUPTI's part
    _, torch_only = flame_for(rank, _at_end(run), non_torch=False)
    assert torch_only.vmm_bytes is None and VMM_KV not in torch_only.root.children


def test_the_flame_svg_names_the_vmm_kv_cache(tmp_path):
    from memtrace.analysis.holders.flame import VMM_KV
    from memtrace.plots.render import render

    run = _run("moe-ext")
    out = tmp_path / "end.svg"
    render(run, out, "flame", at=_at_end(run))
    svg = out.read_text()
    assert "KV cache outside PyTorch (CUDA VMM) 126.23 GiB" in svg
    assert VMM_KV in svg


def test_a_flame_before_034_has_no_vmm_root(tmp_path):
    from memtrace.analysis.holders.flame import VMM_KV
    from memtrace.analysis.holders.moment import flame_for
    from memtrace.plots.render import render

    run = _run("old")
    _, flame = flame_for(run.ranks[0], "peak")
    assert flame.vmm_bytes is None and VMM_KV not in flame.root.children
    render(run, tmp_path / "p.folded", "folded")
    assert "CUDA VMM" not in (tmp_path / "p.folded").read_text()


# --- Perfetto ------------------------------------------------------------------------------------------------


def trace_events(run) -> list[dict]:
    """The trace events ``write_perfetto`` writes for ``run``, read back."""
    import io
    import json

    from memtrace.plots.perfetto import write_perfetto

    out = io.StringIO()
    write_perfetto(run, out)
    return json.loads(out.getvalue())["traceEvents"]


def _counter(run, name: str) -> list[int]:
    return [e["args"]["bytes"] for e in trace_events(run) if e.get("ph") == "C" and e["name"] == name]


@pytest.mark.parametrize("step", EXT)
def test_perfetto_has_a_vmm_kv_cache_counter_and_the_address_space_apart(step, tmp_path):
    import json

    from memtrace.plots.render import render

    run = _run(step)
    rank = run.ranks[0]
    out = tmp_path / "p.perfetto.json"
    render(run, out, "perfetto")
    events = json.loads(out.read_text())["traceEvents"]
    kv = [e["args"]["bytes"] for e in events if e.get("ph") == "C" and e["name"] == "KV cache (CUDA VMM)"]
    assert max(kv) == rank.vmm.kv_cache_peak_bytes and kv[-1] == rank.vmm.kv_cache_bytes
    if step == "moe-ext":
        assert max(kv) == MOE_KV_BYTES
    space = _counter(run, "VMM address space reserved (not memory)")
    assert max(space) == rank.vmm.reserved_peak_bytes
    # PyTorch's reserved counter does not hold it
    assert max(_counter(run, "reserved")) == rank.curves.reserved.peak_bytes < rank.vmm.kv_cache_bytes


def test_perfetto_before_034_has_no_vmm_counter():
    names = {e["name"] for e in trace_events(_run("old")) if e.get("ph") == "C"}
    assert "reserved" in names
    assert not any("VMM" in n for n in names)


# --- the view ------------------------------------------------------------------------------------------------


def test_the_views_data_carries_the_vmm_kv_curve_for_the_band_and_its_readout():
    from memtrace.plots.view_data import pack_rank, rank_meta

    run = _run("moe-ext")
    rank = run.ranks[0]
    t0 = run.origin.t0_us
    meta = rank_meta(rank, t0)
    assert meta["vmm"]["kv_cache_bytes"] == MOE_KV_BYTES
    assert meta["vmm"]["label"] == VMM_KV_LABEL
    assert meta["vmm"]["held_peak_bytes"] == rank.curves.held.peak_bytes
    packed = pack_rank(rank, t0, with_events=False)  # an overview page carries them too
    names = [c["name"] for c in packed.columns]
    assert "vmm_t" in names and "vmm_kv" in names


def test_the_views_data_before_034_has_no_vmm():
    from memtrace.plots.view_data import pack_rank, rank_meta

    run = _run("old")
    assert rank_meta(run.ranks[0], run.origin.t0_us)["vmm"] is None
    assert not any(c["name"].startswith("vmm_") for c in pack_rank(run.ranks[0], run.origin.t0_us).columns)
