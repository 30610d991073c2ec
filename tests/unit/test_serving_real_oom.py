"""The first real serving OOM (tests/data/vllm-h200-034-serving/oom, issue 30): vLLM 0.34.0 ``vllm serve`` under
``memtrace run --until serving`` on an H200 left 24 GiB by a holder process; after start-up a neighbour took all
but 256 MiB of what was free, then a burst of requests: torch raised OutOfMemoryError in serving. Every figure
asserted here is read from torch's own message in vLLM's log, or from the holder's and neighbour's logs."""

from __future__ import annotations

import re

import pytest
from memtrace.analysis.analysed.run import analyse
from memtrace.cli import main
from memtrace.store import load_run
from vllm034_data import TORCH_SIZE, Recorded

SERVING = Recorded("vllm-h200-034-serving")
MiB = 1 << 20


@pytest.fixture(scope="module")
def run_dir():
    return SERVING.run_dir("oom")


@pytest.fixture(scope="module")
def rank(run_dir):
    return analyse(load_run(run_dir).traces).ranks[0]


def torch_says(what: str) -> str:
    """A figure of torch's OutOfMemoryError in vLLM's log, as torch printed it ("22.00 MiB")."""
    return SERVING.torch_says(
        "oom",
        what,
        {  # the two other processes on the card, by the pids torch named
            "holder": rf"OutOfMemoryError: .* Process 6185 has {TORCH_SIZE} memory in use",
            "neighbour": rf"OutOfMemoryError: .* Process 6770 has {TORCH_SIZE} memory in use",
        },
    )


def _report(run_dir, capsys) -> str:
    assert main(["report", str(run_dir)]) == 0
    return capsys.readouterr().out


def _window_section(text: str) -> str:
    return text.split("\nServing window\n", 1)[1].split("\nDefinitions\n", 1)[0]


def test_the_windows_oom_is_torchs_failed_request_with_its_bytes_and_the_allocator_limit(run_dir, capsys):
    section = _window_section(_report(run_dir, capsys))
    assert torch_says("requested") == "22.00 MiB" and torch_says("free") == "19.94 MiB"
    assert torch_says("allowed") == "12.25 GiB"  # vLLM's cap on torch (set_per_process_memory_fraction)
    assert (
        "DIED: CUDA out of memory at 28.96 s in serving: requested 22.00 MiB (23,068,672 B), device free "
        "19.94 MiB (20,905,984 B), allocator limit 12.25 GiB (13,154,975,744 B)"
    ) in " ".join(section.split())
    assert "free of 12.25 GiB" not in section  # the limit is PyTorch's, not the device's total


def test_the_windows_oom_is_the_one_the_headline_names(rank):
    assert rank.window.oom == rank.oom  # analysis.oom.Oom, one answer for every output
    assert rank.window.oom.requested_bytes == 22 * MiB


def test_the_growth_table_reads_every_figure_in_its_headers_unit_and_a_tiny_one_never_as_zero(run_dir, capsys):
    """Issue 41: "68 B" stood in the GiB column; a figure too small for two decimals of GiB reads "<0.01"."""
    section = _window_section(_report(run_dir, capsys))
    table = section.split("allocated in the window, live at its end", 1)[1].split("\n\n", 1)[0]
    assert table.split("\n", 1)[0].split()[-2:] == ["GiB", "blocks"]
    assert "0.000" not in table and " 0.00 " not in table and " B " not in table and "KiB" not in table
    assert re.search(r"sample/sampler\.py:191 __call__ +<0\.01 +1", table)
    assert re.search(r"kernels/vllm_c\.py:42 rms_norm +0\.07 +3", table)


def test_the_issue_bundle_and_the_view_word_the_failed_allocation_as_torch_does(rank, run_dir, tmp_path):
    from memtrace.plots.view_data import pack_rank

    assert main(["issue", str(run_dir), "-o", str(tmp_path / "bundle")]) == 0
    first_screen = "\n".join((tmp_path / "bundle" / "issue.md").read_text().splitlines()[:20])
    assert (
        "- **Failed allocation at 28.96 s in serving:** requested 22.00 MiB (23,068,672 B), device free 19.94 MiB "
        "(20,905,984 B), allocator limit 12.25 GiB (13,154,975,744 B)."
    ) in first_screen
    packed = pack_rank(rank, rank.origin.t0_us)
    assert packed.window is None  # one run in time: the rank's own part holds the window and its OOM
    assert packed.meta["oom"]["label"] == "OOM (requested 22.00 MiB)"


GiB = 1 << 30


def _gib(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"GiB": 1, "MiB": 1 / 1024, "KiB": 1 / 1024**2}[unit]


def test_what_held_pytorchs_memory_at_the_oom_is_torchs_own_figures_to_the_rounding(rank):
    from memtrace.units import format_size

    a = rank.window.device.end.allocator
    assert format_size(a.blocks_bytes + a.private_cached_bytes) == torch_says("allocated") == "11.17 GiB"
    assert format_size(a.private_cached_bytes) == torch_says("private pools") == "2.00 MiB"
    assert format_size(a.reserved_unused_bytes) == torch_says("reserved unallocated") == "29.76 MiB"
    assert a.reserved_unused_bytes == 31_202_304 == rank.window.reserved_unused_bytes  # the default pool's free blocks
    assert a.reserved_bytes == a.blocks_bytes + a.private_cached_bytes + a.reserved_unused_bytes == 12_029_263_872


def test_the_device_at_the_oom_is_torchs_free_figure_and_another_process_took_the_headroom(rank):
    from memtrace.analysis.serving.serving_held import DERIVED
    from memtrace.units import format_size

    d = rank.window.device
    assert d.at_oom and d.end.time_us == rank.oom.time_us
    assert d.end.free_bytes == 20_905_984 and format_size(d.end.free_bytes) == torch_says("free")
    assert d.end.vmm_bytes == d.startup_end.vmm_bytes == 11_190_403_072  # the KV cache, committed at start-up
    # other processes: the holder when start-up ended (torch names it at the OOM with the same figure)...
    assert format_size(d.startup_end.others_bytes) == torch_says("holder") == "115.88 GiB"
    # ...and the neighbour after it; a 1.4 window did not sample them: derived, within torch's rounding + 10 MiB
    assert d.derived == DERIVED
    others_then = _gib(torch_says("holder")) + _gib(torch_says("neighbour"))
    assert abs(d.end.others_bytes / GiB - others_then) < 0.015
    assert abs(d.change(lambda h: h.others_bytes) / GiB - _gib(torch_says("neighbour"))) < 0.015
    assert abs(d.end.this_process_bytes / GiB - _gib(torch_says("this process"))) < 0.015
    # what was free when start-up ended went to the other processes, not to this one
    assert d.startup_end.free_bytes == 1_811_480_576
    assert d.change(lambda h: h.others_bytes) > 10 * d.change(lambda h: h.this_process_bytes) > 0
    assert d.within_limit is True  # 11.20 GiB reserved + 22.00 MiB < 12.25 GiB allowed: the device ran out


def test_the_report_states_what_held_the_device_at_the_oom_and_since_start_up(run_dir, capsys):
    section = " ".join(_window_section(_report(run_dir, capsys)).split())
    for row in (
        "PyTorch allocated (blocks) 11.17 GiB 11.03 GiB +146.25 MiB",
        "PyTorch private pools, cached 2.00 MiB 2.00 MiB 0 B",
        "PyTorch reserved, unallocated 29.76 MiB 34.00 MiB -4.25 MiB",
        "KV cache outside PyTorch (CUDA VMM) 10.42 GiB 10.42 GiB 0 B",
        "other processes 117.41 GiB† 115.88 GiB +1.53 GiB†",
        "device free 19.94 MiB 1.69 GiB -1.67 GiB",
    ):
        assert row in section
    assert (
        "other processes +1.53 GiB†, device used by this process +142.00 MiB†, of the 1.69 GiB that was free" in section
    )
    assert "within 12.25 GiB: the device ran out, not the limit" in section
    assert "† Derived: this window sampled the whole device only (trace format 1.4)" in section


def test_a_1_4_windows_nvml_samples_are_the_whole_device_never_this_processs(rank, tmp_path):
    from memtrace.plots.timeline import render_timeline
    from memtrace.plots.timeline_data import prepare_rank

    # the window analysed alone (start-up's rank keeps it apart); before: 140 GiB of "device used by this process"
    assert not rank.boot_rank.serving.curves.has_device
    whole = rank.window.device_used_all
    assert int(whole.bytes[-1]) == rank.trace.process.device_total_bytes - 20_905_984  # the device full at the OOM
    drawn = render_timeline([prepare_rank(rank)], tmp_path / "t.png", t0_us=rank.origin.t0_us)
    assert "device used, all processes (NVML; not told apart)" in drawn.legend


def test_a_window_that_sampled_other_processes_tells_them_apart_from_non_pytorch(rank):
    """CONSTRUCTED from the real trace: its window as the 1.5 sampler records it, with other processes' memory at
    each NVML sample (the holder's, as start-up's sidecar read it, then the neighbour's 1.52 GiB on top from when
    the device's used memory jumped at 17.84 s)."""
    import dataclasses

    import numpy as np
    from memtrace.model import OTHERS_DTYPE

    t = rank.startup  # the trace as recorded (rank.trace is the run joined in time)
    w = t.window
    holder, neighbour = int(t.others["others_bytes"][-1]), 1_632_632_832
    series = np.zeros(len(w.samples), dtype=OTHERS_DTYPE)
    series["time_us"] = w.samples["time_us"]
    series["others_bytes"] = holder + np.where(w.samples["time_us"] >= t.recording.start_us + 17_844_619, neighbour, 0)
    told = dataclasses.replace(t, window=dataclasses.replace(w, others=series))
    r = analyse([told]).ranks[0]
    d = r.window.device
    assert d.derived == "" and r.window.device_used_all is None
    assert d.end.others_bytes == holder + neighbour and d.change(lambda h: h.others_bytes) == neighbour
    a = d.end.allocator
    assert d.end.non_torch_bytes == d.end.used_all_bytes - a.reserved_bytes - d.end.vmm_bytes - holder - neighbour
    # the window's curves: this process's device used, the others taken out, as start-up's
    used = r.boot_rank.serving.curves.device_used  # the window analysed alone
    assert int(used.bytes[-1]) == int(w.samples["used_bytes"][-1]) - 644_939_776 - holder - neighbour


def test_the_view_states_what_held_the_device_and_names_no_gap_where_there_was_none(rank):
    from memtrace.plots.view_data import pack_rank

    meta = pack_rank(rank, rank.origin.t0_us).meta
    held = next(line for line in meta["serving"] if line.startswith("Held at the OOM: "))
    assert "device used by this process 22.37 GiB†" in held and "other processes 117.41 GiB†" in held
    assert "PyTorch reserved, unallocated 29.76 MiB" in held and "device free 19.94 MiB" in held
    assert rank.trace.window.gap_us == 0
    # one run in time (issue 40 case 5): the window is drawn in the rank's own timeline, after start-up
    assert meta["serving_heading"].endswith("on the chart below under the serving bar, one timeline with start-up)")


def test_the_step_the_oom_happened_in_is_said_to_be_missing_from_a_1_4_windows_list(rank, run_dir, capsys):
    # vLLM's dump of the step that failed: 5489 tokens scheduled; the window lists steps that ended, not it
    failed_tokens = int(SERVING.logged("oom", r"total_num_scheduled_tokens=(\d+)"))
    assert failed_tokens == 5489 and all(s.get("tokens") != failed_tokens for s in rank.trace.window.steps)
    assert rank.window.steps_in_progress is None and rank.window.step_at_oom is None
    section = " ".join(_window_section(_report(run_dir, capsys)).split())
    assert (
        "the scheduler step the OOM happened in is not in the list: this window (trace format 1.4) records a step "
        "when it ends; the last one listed ended at 28.94 s, 14.7 ms before the OOM"
    ) in section


def test_the_flame_graph_at_the_oom_words_the_failed_request_as_torch_does(run_dir, tmp_path, capsys):
    out = tmp_path / "oom.svg"
    assert main(["flame", str(run_dir), "--at", "oom", "-o", str(out)]) == 0
    svg = out.read_text()
    assert "requested 22.00 MiB, device free 19.94 MiB, allocator limit 12.25 GiB" in svg
    assert "0.02 GiB free" not in svg


def test_the_flame_graphs_legend_stays_inside_its_width_with_the_vmm_kv_cache_named(run_dir, tmp_path):
    from memtrace.plots.flame_svg import CHAR_PX, PAD

    out = tmp_path / "oom.svg"
    assert main(["flame", str(run_dir), "--at", "oom", "-o", str(out)]) == 0
    svg = out.read_text()
    width = int(re.search(r'<svg [^>]*width="(\d+)"', svg).group(1))
    items = re.findall(r'rx="2"/><text x="(\d+)" y="(\d+)">([^<]+)</text>', svg)
    assert "KV cache outside PyTorch (CUDA VMM)" in [name for _, _, name in items]  # before: cut at the edge
    assert all(int(x) + len(name) * CHAR_PX <= width - PAD for x, _, name in items)
    assert len({y for _, y, _ in items}) == 2  # wrapped onto a second row
