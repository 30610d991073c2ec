"""The CUPTI source on a real vLLM 0.25.1 start-up on the H200 (tests/gpu/cupti_round.sh, 2026-12-02):
1,745 records, PyTorch's segments recognised, the non-PyTorch rest broken down at the first crossing."""

from pathlib import Path

from memtrace.analysis.memory import non_torch
from memtrace.model import MEMORY_OPS
from memtrace.store import load_trace
from references import summarize
from testdata import unpacked

TRACE = unpacked(Path(__file__).parents[1] / "data" / "vllm-h200" / "startup-cupti" / "vm-pid1909-rank0.memtrace")


def test_records_stacks_and_pytorchs_segments():
    t = load_trace(TRACE)
    fact = t.facts["cupti"]
    assert (fact["records"], fact["records_with_stack"], fact["stacks"]) == (1745, 84, True)
    made = non_torch.torch_made(t)
    release = t.device_allocs["op"] == MEMORY_OPS.index("release")
    # 77 of the 80 device allocations are PyTorch's segments, and all 24 releases free one of them
    assert (int((made & ~release).sum()), int((made & release).sum()), int(release.sum())) == (77, 24, 24)
    assert any("drain watchdog off" in n.text for n in t.notes)


def test_breakdown_at_the_first_crossing_adds_up_to_nvml():
    first = next(b for b in summarize(load_trace(TRACE)).non_torch_moments if b.moment == "first crossing")
    assert first.phase_path == "kv_cache_init"
    assert first.cupti_bytes == 68_362_212  # CUPTI saw 0.06 GiB of non-PyTorch device memory
    assert first.nvml_non_torch_bytes == 808_255_488
    assert first.unexplained_bytes == first.nvml_non_torch_bytes - first.cupti_bytes == 739_893_276
    assert first.torch_bytes > 128 * 2**30  # PyTorch's segments recognised, not counted as non-PyTorch
    # the unexplained rest: 0.67 GiB was there when recording began (CUDA context), 12 MiB grew right
    # after CUPTI was enabled (its own: the same start-up without CUPTI stays 12,582,912 B lower,
    # test_cupti_cost_h200.py), 4.8 MiB grew later without a record
    assert (first.at_start_bytes, first.cupti_own_bytes, first.grew_unseen_bytes) == (
        722_272_256,
        12_582_912,
        5_038_108,
    )
    assert first.at_start_bytes + first.cupti_own_bytes + first.grew_unseen_bytes == first.unexplained_bytes


def test_categories_name_the_compiled_graph_and_the_kernel_modules():
    first = next(b for b in summarize(load_trace(TRACE)).non_torch_moments if b.moment == "first crossing")
    other = first.category(non_torch.OTHER)
    # three raw cudaMallocs (64 MiB + 128 KiB + 1 KiB) inside one torch op called from Inductor's code
    assert (other.bytes, other.count, other.libraries) == (67_240_960, 3, ((non_torch.COMPILED, 67_240_960),))
    top = other.largest[0]
    assert (top.bytes, top.frame.name, top.frame.line, top.phase_path) == (
        64 * 2**20,
        "call",
        947,
        "determine_available_memory/profile_run",
    )
    assert "/torch/" not in top.frame.filename  # named by the code that called the op, not torch/_ops.py
    statics = first.category(non_torch.MODULES)
    assert (statics.bytes, statics.count) == (1_121_252, 1_483)  # the __device__ globals of loaded kernels
    assert other.bytes + statics.bytes == first.cupti_bytes


def test_live_curve_is_the_non_pytorch_bytes_cupti_saw():
    t = load_trace(TRACE)
    curve = non_torch.live_curve(t)
    first = next(b for b in summarize(t).non_torch_moments if b.moment == "first crossing")
    assert curve.at(first.time_us) == first.cupti_bytes
    assert int(curve.bytes.max()) == 68_364_089


def test_report_states_the_breakdown_in_bytes():
    import io

    from memtrace.plots.text import render_report

    buf = io.StringIO()
    render_report(summarize(load_trace(TRACE)), buf)
    text = " ".join(buf.getvalue().split())
    assert "other libraries 67,240,960 0.06 3" in text
    assert "kernel modules' statics 1,121,252 1.07 MiB 1,483" in text  # too small for 0.01 GiB: its own unit
    assert "unexplained 739,893,276 0.69" in text
    assert "722,272,256 B present when recording began" in text and "5,038,108 B grew while recording" in text
    assert "12,582,912 B CUPTI's own" in text
    assert "cu3svbzqvt7ri5nuodhjv3gvdgpsuamhai3ep62kw5cs3ozoovof.py:947 call (67,108,864 B in" in text
    assert "at the peak" in text and "the same non-PyTorch figures as at the first crossing" in text


def test_fits_splits_its_assumed_non_pytorch_memory_by_cuptis_records():
    from capacity_model import fit
    from memtrace.analysis.capacity import fits

    r = fit(load_trace(TRACE), 80 * 2**30)
    assert r.non_torch_source == fits.NT_AT_SIZING
    assert r.non_torch_cupti_bytes == 68_362_212  # the 64 MiB + 128 KiB + 1 KiB of profile_run and the statics
    assert r.non_torch_at_start_bytes == 722_272_256
    assert r.non_torch_cupti_own_bytes == 12_582_912
    parts = (
        r.non_torch_cupti_bytes,
        r.non_torch_at_start_bytes,
        r.non_torch_cupti_own_bytes,
        r.non_torch_grew_unseen_bytes,
    )
    assert sum(parts) == r.non_torch_bytes
    given = fit(load_trace(TRACE), 80 * 2**30, non_torch_bytes=2**30)  # --non-torch: nothing to split
    assert (given.non_torch_cupti_bytes, given.non_torch_at_start_bytes) == (None, None)


def test_perfetto_export_carries_the_exact_non_pytorch_counter(tmp_path):
    import json

    from memtrace.cli import main

    out = tmp_path / "t.perfetto.json"
    assert main(["export", str(TRACE), "--format", "perfetto", "-o", str(out)]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    cupti = [e for e in events if e.get("name") == "non-PyTorch seen by CUPTI"]
    t0 = json.loads(out.read_text())["otherData"]["t0_us"]
    first = next(b for b in summarize(load_trace(TRACE)).non_torch_moments if b.moment == "first crossing")
    before = [e["args"]["bytes"] for e in cupti if e["ts"] + t0 <= first.time_us]
    assert before[-1] == first.cupti_bytes == 68_362_212
    assert max(e["args"]["bytes"] for e in cupti) == 68_364_089
