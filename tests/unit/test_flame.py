"""The flame graph at a moment: folded lines add up to the live bytes exactly, hook calls get frames
of their own, the SVG's widest frames are what was live, and `memtrace flame` refuses bad input.

SYNTHETIC data from tests/synthetic_startup.py; real H200 traces under tests/data when present.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import synthetic_startup
from memtrace.analysis.holders.flame import BEFORE_RECORDING, HOOK_PREFIX, flame_at, frame_label
from memtrace.analysis.holders.live import holders_by_stack
from memtrace.analysis.memory.curves import all_curves
from memtrace.cli import main
from memtrace.model import ACTION_CODE, Frame, Trace, empty_events
from memtrace.plots.flame_svg import render_flame_svg
from memtrace.plots.folded import folded_lines, render_folded
from memtrace.store import save_trace
from references import peak_event_index, window_peak_event_index
from testdata import data_name, unpacked
from testdata import real_traces as _real_traces

TESTS = Path(__file__).resolve().parents[1]
GiB, MiB = 1024**3, 1024**2
SVG = "{http://www.w3.org/2000/svg}"


def _synthetic():
    return synthetic_startup


@pytest.fixture(scope="module")
def startup():
    return _synthetic().synthetic_startup()


def _folded_total(lines: list[str]) -> int:
    return sum(int(line.rsplit(" ", 1)[1]) for line in lines)


def test_the_peak_includes_the_block_whose_segment_made_the_reserved_peak(startup):
    curves = all_curves(startup)
    k = peak_event_index(curves.allocated, curves.reserved)
    flame = flame_at(startup, event_index=k)
    # 24 GiB weights + 4 GiB workspace + 14 GiB activation + 20 MiB from init_device
    assert flame.total_bytes == 42 * GiB + 20 * MiB
    assert curves.reserved.bytes[k + 1] == curves.reserved.peak_bytes


@pytest.mark.parametrize("seconds", [0.0, 1.0, 13.001, 18.0, 18.02, 30.0, 58.0])
def test_folded_lines_sum_to_the_allocated_curve_at_that_moment(startup, seconds):
    t = _synthetic().T0 + int(seconds * 1e6)
    flame = flame_at(startup, t)
    assert _folded_total(folded_lines(flame)) == flame.total_bytes == all_curves(startup).allocated.at(t)


def test_workspace_allocations_sit_under_a_hook_frame_just_outside_the_allocator(startup):
    flame = flame_at(startup, event_index=peak_event_index(*_alloc_res(startup)))
    hooked = [(p, b) for p, b in flame.stacks.items() if any(f.startswith(HOOK_PREFIX) for f in p)]
    assert len(hooked) == 1
    path, nbytes = hooked[0]
    assert nbytes == 4 * GiB
    i = path.index(HOOK_PREFIX + "allocate_sm120_dynamic_workspace")
    assert path[i + 1].startswith("allocate_sm120_dynamic_workspace (flashinfer/fused_moe/")
    assert path[i - 1].startswith("apply (vllm/model_executor/layers/fused_moe/flashinfer_b12x.py")


def _alloc_res(trace):
    c = all_curves(trace)
    return c.allocated, c.reserved


def test_folded_lines_run_root_to_leaf_and_are_sorted_largest_first(startup):
    lines = folded_lines(flame_at(startup, event_index=peak_event_index(*_alloc_res(startup))))
    first_frames, sizes = zip(*[(ln.split(";")[0], int(ln.rsplit(" ", 1)[1])) for ln in lines], strict=True)
    assert all(f.startswith("execute_method (vllm/v1/worker/worker_base.py") for f in first_frames)
    assert lines[0].endswith(f"create_weights (vllm/model_executor/layers/linear.py:301) {24 * GiB}")
    assert list(sizes) == sorted(sizes, reverse=True)


def test_frame_labels_cut_site_packages_and_never_contain_semicolons():
    f = Frame("/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_worker.py", 406, "load;model")
    assert frame_label(f) == "load:model (vllm/v1/worker/gpu_worker.py:406)"


def test_blocks_from_before_recording_and_without_stacks_get_marker_frames():
    ev = empty_events(2)
    ev[0] = (10, ACTION_CODE["alloc"], 0x2000, 100, 0, -1)
    ev[1] = (20, ACTION_CODE["free_completed"], 0x1000, 50, 0, -1)  # its alloc predates the recording
    trace = Trace(events=ev)
    flame = flame_at(trace, 15)
    assert flame.stacks == {("[no stack recorded]", "[phase] (outside any phase)"): 100, (BEFORE_RECORDING,): 50}


def _svg_frames(path: Path) -> dict[str, float]:
    """Frame name (first line of each <title>) -> drawn width in pixels."""
    out = {}
    for g in ET.parse(path).getroot().iter(f"{SVG}g"):
        title, rect = g.find(f"{SVG}title"), g.find(f"{SVG}rect")
        if title is not None and rect is not None:
            out[title.text.split("\n")[0]] = max(out.get(title.text.split("\n")[0], 0), float(rect.get("width")))
    return out


def test_svg_widest_frames_are_the_allocations_live_at_the_peak(startup, tmp_path):
    k = peak_event_index(*_alloc_res(startup))
    flame = flame_at(startup, event_index=k)
    drawn = render_flame_svg(flame, tmp_path / "f.svg", title="t", subtitle="s")
    widths = _svg_frames(tmp_path / "f.svg")
    scale = (1200 - 20) / flame.total_bytes
    weights, activation = (h for h in holders_by_stack(startup, event_index=k, top=2))
    assert (weights.bytes, activation.bytes) == (24 * GiB, 14 * GiB)
    leaf = frame_label(startup.stack_frames(weights.stack)[0])
    assert leaf.startswith("create_weights") and widths[leaf] == pytest.approx(24 * GiB * scale, abs=0.01)
    # the activation was allocated in apply(), which also called the hooked workspace allocator
    leaf = frame_label(startup.stack_frames(activation.stack)[0])
    assert leaf.startswith("apply") and widths[leaf] == pytest.approx(18 * GiB * scale, abs=0.01)
    assert widths["[hook] allocate_sm120_dynamic_workspace"] == pytest.approx(4 * GiB * scale, abs=0.01)
    assert drawn.total_bytes == 42 * GiB + 20 * MiB
    assert widths["all live memory: 42.02 GiB"] == pytest.approx(1180, abs=0.01)


def test_svg_is_self_contained_and_hover_titles_give_bytes_and_share(startup, tmp_path):
    flame = flame_at(startup, event_index=peak_event_index(*_alloc_res(startup)))
    render_flame_svg(flame, tmp_path / "f.svg", title="t")
    text = (tmp_path / "f.svg").read_text()
    assert "<script" not in text and "href" not in text and "@import" not in text
    assert re.findall(r"https?://[^\"\s]+", text) == ["http://www.w3.org/2000/svg"]
    assert "[hook] allocate_sm120_dynamic_workspace\n4.00 GiB (9.5% of live) in 2 allocations" in text


def test_an_empty_moment_renders_an_empty_flame(tmp_path):
    flame = flame_at(Trace(), 0)
    drawn = render_flame_svg(flame, tmp_path / "e.svg", title="nothing live")
    render_folded(flame, tmp_path / "e.folded")
    assert drawn.total_bytes == 0 and (tmp_path / "e.folded").read_text() == ""
    ET.parse(tmp_path / "e.svg")  # well-formed


def test_window_peak_finds_the_fullest_moment_of_a_phase(startup):
    s = _synthetic()
    curves = all_curves(startup)
    k = window_peak_event_index(curves.allocated, s.T0 + 12_500_000, s.T0 + 20_000_000)
    assert curves.allocated.bytes[k + 1] == 42 * GiB + 20 * MiB


@pytest.fixture()
def run_dir(tmp_path, startup):
    save_trace(startup, tmp_path / "synth" / "rank0.memtrace")
    return tmp_path / "synth"


def test_flame_cli_writes_deterministic_names_and_never_overwrites(run_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["flame", str(run_dir)]) == 0
    assert (tmp_path / "synth-flame.svg").exists()
    assert main(["flame", str(run_dir)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["flame", str(run_dir), "--force"]) == 0


def test_flame_cli_folded_at_a_phase_sums_to_that_phase_peak(run_dir, tmp_path, startup):
    out = tmp_path / "p.folded"
    assert main(["flame", str(run_dir), "--at", "profile_run", "-o", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert _folded_total(lines) == 42 * GiB + 20 * MiB


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--at", "99"], "the run lasts 58.501 s"),
        (["--at", "no_such_phase"], "no such phase"),
        (["--rank", "3"], "has no rank 3"),
    ],
)
def test_flame_cli_bad_moments_ranks_are_one_line_exit_2(run_dir, tmp_path, capsys, argv, message):
    assert main(["flame", str(run_dir), "-o", str(tmp_path / "x.svg"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0


def test_flame_cli_on_a_trace_without_events_is_exit_2(tmp_path, capsys):
    save_trace(Trace(), tmp_path / "empty.memtrace")
    assert main(["flame", str(tmp_path / "empty.memtrace"), "-o", str(tmp_path / "x.svg")]) == 2
    assert "no allocator events" in capsys.readouterr().err


@pytest.mark.parametrize("path", _real_traces(), ids=data_name)
def test_real_trace_folded_at_the_peak_sums_to_the_live_bytes(path, tmp_path):
    from memtrace.store import load_trace

    trace = load_trace(path)
    if not len(trace.events):
        pytest.skip("no allocator events (CPU-only worker)")
    curves = all_curves(trace)
    k = peak_event_index(curves.allocated, curves.reserved)
    flame = flame_at(trace, event_index=k, non_torch=True)  # the CUPTI part too, where recorded
    assert flame.torch_bytes == int(curves.allocated.bytes[k + 1])
    assert _folded_total(folded_lines(flame)) == flame.total_bytes == flame.torch_bytes + (flame.non_torch_bytes or 0)
    render_flame_svg(flame, tmp_path / "f.svg", title="real")
    widths = _svg_frames(tmp_path / "f.svg")
    top = holders_by_stack(trace, event_index=k, top=1)[0]
    if top.stack >= 0:
        leaf = frame_label(trace.stack_frames(top.stack)[0])
        assert widths[leaf] == pytest.approx(max(w for n, w in widths.items() if n == leaf), abs=0.01)
        assert widths[leaf] >= top.bytes * (1180 / flame.total_bytes) - 0.01
    assert np.isfinite(flame.total_bytes)


def test_memtrace_wrapper_frames_are_dropped_and_the_hook_frame_sits_outside_the_hooked_function():
    site = "/venv/lib/python3.12/site-packages/"
    frames = [  # innermost first, as recorded
        Frame(
            site + "flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_dispatch.py",
            212,
            "allocate_sm120_dynamic_workspace",
        ),
        Frame(site + "memtrace/plugins/hooks.py", 360, "wrapper"),
        Frame(site + "vllm/model_executor/layers/fused_moe/flashinfer_b12x.py", 97, "apply"),
        Frame(site + "vllm/v1/worker/gpu_model_runner.py", 6290, "profile_run"),
        Frame(site + "memtrace/plugins/hooks.py", 360, "wrapper"),  # the phase hook around profile_run
        Frame(site + "vllm/v1/worker/gpu_worker.py", 430, "determine_available_memory"),
    ]
    ev = empty_events(2)
    ev[0] = (10, ACTION_CODE["alloc"], 0x1000, 100, 0, 0)
    ev[1] = (30, ACTION_CODE["alloc"], 0x2000, 7, 0, 1)
    from memtrace.model import HookCall

    trace = Trace(
        events=ev,
        frames=frames,
        stacks=[tuple(range(6)), (2, 3, 4, 5)],
        hook_calls=[
            HookCall(
                "flashinfer.fused_moe.cute_dsl.blackwell_sm12x.moe_dispatch:allocate_sm120_dynamic_workspace", 5, 20
            )
        ],
    )
    flame = flame_at(trace, 40)
    names = {tuple(f.split(" (")[0] for f in path): b for path, b in flame.stacks.items()}
    assert names == {
        (
            "determine_available_memory",
            "profile_run",
            "apply",
            "[hook] allocate_sm120_dynamic_workspace",
            "allocate_sm120_dynamic_workspace",
        ): 100,
        ("determine_available_memory", "profile_run", "apply"): 7,
    }


def _oom_runs() -> list[Path]:
    return sorted(p for p in (TESTS / "data" / "h200").glob("startup-*") if "died_in" in _facts_of(p))


def _facts_of(run: Path) -> dict:
    from memtrace.store import load_run

    return load_run(run).traces[0].facts


@pytest.mark.parametrize("run", _oom_runs(), ids=lambda p: p.name)
def test_real_h200_oom_peak_flame_holds_what_torch_counted_when_the_card_died(run):
    """Independent check: torch's own max_memory_allocated (counted in 512 B blocks) at the death."""
    from memtrace.store import load_run

    trace = load_run(run).traces[0]
    curves = all_curves(trace)
    flame = flame_at(trace, event_index=peak_event_index(curves.allocated, curves.reserved))
    torch_max = max(c["max_memory_allocated"] for c in trace.facts["torch_counters"])
    assert torch_max * 0.998 <= flame.total_bytes <= torch_max
    assert _folded_total(folded_lines(flame)) == flame.total_bytes
    assert any(p[-1].startswith("allocate_sm120_dynamic_workspace") for p in flame.stacks)


VLLM_RUN = unpacked(TESTS / "data" / "vllm-h200" / "startup")


def test_real_vllm_peak_flame_without_stacks_groups_by_phase_and_matches_vllms_own_kv_and_weights():
    """Independent check: vLLM's own figures (the KV cache it allocated, the weights it measured)."""
    from memtrace.store import load_run

    if not VLLM_RUN.is_dir():
        pytest.skip("no real vLLM trace under tests/data/vllm-h200")
    trace = load_run(VLLM_RUN).traces[0]
    curves = all_curves(trace)
    flame = flame_at(trace, event_index=peak_event_index(curves.allocated, curves.reserved))
    by_phase = {p[-1]: b for p, b in flame.stacks.items() if p[0] == "[no stack recorded]"}
    assert by_phase["[phase] kv_cache_init"] == pytest.approx(trace.facts["vllm.kv_cache_bytes"], abs=1024)
    assert by_phase["[phase] load_model"] == pytest.approx(trace.facts["vllm.weights_memory_bytes"], rel=0.001)
    assert _folded_total(folded_lines(flame)) == flame.total_bytes == int(curves.allocated.bytes.max())


def test_real_flashinfer_hook_frames_hold_exactly_the_bytes_the_hooked_calls_returned():
    """Real FlashInfer 0.6.13 allocators on the H200, hooked: each top-level call returned 94,974,860 B."""
    from memtrace.store import load_run
    from references import category_curves

    run = TESTS / "data" / "vllm-h200" / "flashinfer-probe"
    if not run.is_dir():
        pytest.skip("no real FlashInfer probe trace")
    trace = load_run(run).traces[0]
    top_calls = [h for h in trace.hook_calls if h.parent is None]
    curves = all_curves(trace)
    flame = flame_at(trace, event_index=peak_event_index(curves.allocated, curves.reserved))
    under_hooks = sum(b for p, b in flame.stacks.items() if p[1].startswith(HOOK_PREFIX))
    assert under_hooks == flame.total_bytes == sum(h.returned_bytes for h in top_calls) == 3 * 94_974_860
    nested = [p for p in flame.stacks if p[1] == HOOK_PREFIX + "allocate_sm120_moe_workspace"]
    assert nested and all(HOOK_PREFIX + "allocate_sm120_dynamic_workspace" in p for p in nested)
    assert category_curves(trace)["flashinfer_workspace"].bytes[-1] == 3 * 94_974_860


def test_frame_labels_start_at_the_package_when_installed_outside_site_packages():
    f = Frame("/tmp/site/flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_dispatch.py", 1264, "alloc")
    assert frame_label(f) == "alloc (flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_dispatch.py:1264)"
    assert frame_label(Frame("/home/u/proj/train.py", 3, "main")) == "main (proj/train.py:3)"
