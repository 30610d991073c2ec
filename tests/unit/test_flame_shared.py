"""The flame graph leaves out the frames every stack shares and draws what lies beside the widest stack at its
own scale (issue 34, item 5), on the real vLLM 0.25.1 start-up with Python stacks (the README's figure).

Before: docs/flame.svg drew eight full-width rows of multiprocessing and launcher frames, and the 10.49 GiB of
weights as a column 96 px wide of cut labels ("load_mo…:413") beside the 117.02 GiB KV cache.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from memtrace.analysis.analysed.run import analyse
from memtrace.analysis.holders.flame import shared_prefix, stack_counts, without_prefix
from memtrace.analysis.holders.moment import flame_for
from memtrace.plots.flame_svg import render_flame_svg
from memtrace.plots.folded import folded_lines
from memtrace.store import load_run
from testdata import unpacked

RUN = unpacked(Path(__file__).resolve().parents[1] / "data" / "vllm-h200" / "startup-stacks")
LAUNCHER = ("<module> (<string>:1)", "spawn_main (multiprocessing/spawn.py:122)", "_main (multiprocessing/spawn.py:135)",
            "_bootstrap (multiprocessing/process.py:314)", "run (multiprocessing/process.py:108)",
            "run_engine_core (vllm/v1/engine/core.py:1200)", "sync_wrapper (vllm/tracing/otel.py:178)",
            "__init__ (vllm/v1/engine/core.py:966)")  # fmt: skip


@pytest.fixture(scope="module")
def peak():
    run = analyse(load_run(RUN).traces, path=str(RUN))
    return flame_for(run.worst, "peak", non_torch=True)[1]


def test_the_shared_frames_are_the_multiprocessing_and_vllm_launcher_frames(peak):
    assert shared_prefix(peak) == LAUNCHER


def test_without_them_every_stack_keeps_its_bytes_and_allocations(peak):
    trimmed = without_prefix(peak, shared_prefix(peak))
    assert trimmed.total_bytes == peak.total_bytes == sum(trimmed.stacks.values())
    assert sum(stack_counts(trimmed).values()) == sum(stack_counts(peak).values()) == peak.root.count
    assert not any(p[: len(LAUNCHER)] == LAUNCHER for p in trimmed.stacks)
    # the 26 blocks from before recording (no Python frames) stay as they were
    assert sum(b for p, b in trimmed.stacks.items() if p[0] == "[present before recording began]") > 0


def test_the_folded_export_keeps_every_frame(peak):
    lines = folded_lines(peak)
    assert sum(int(x.rsplit(" ", 1)[1]) for x in lines) == peak.total_bytes
    assert lines[0].startswith(";".join(LAUNCHER) + ";")


def test_the_svg_names_the_frames_it_left_out_and_draws_the_weights_wide_and_named(peak, tmp_path):
    out = tmp_path / "f.svg"
    drawn = render_flame_svg(peak, out, title="t")
    svg = out.read_text()
    assert drawn.shared == LAUNCHER and drawn.rest_panel
    assert "Not drawn: the 8 frames every stack begins with: &lt;module&gt;:1 › spawn_main:122" in svg
    assert ">spawn_main (multiprocessing/spawn.py:122)" not in svg  # no box of its own any more
    assert "Beside the widest stack, _allocate_kv_cache_tensors:7107 (117.02 GiB, 91%)" in svg
    boxes = re.findall(r'<rect x="[\d.]+" y="\d+" width="([\d.]+)"[^>]*/><text[^>]*>([^<]*)</text>', svg)
    widths = {text: float(w) for w, text in boxes}
    # the weights' loader, in full with its bytes, across most of the panel's width
    loader = "load_model (vllm/v1/worker/gpu_worker.py:413) · 10.49 GiB"
    assert widths[loader] > 0.9 * 1180
    assert widths["create_weights:103 · 6.00 GiB"] > 500


def test_a_flame_without_one_dominant_stack_gets_no_second_panel(tmp_path):
    run = analyse(load_run(RUN).traces, path=str(RUN))
    flame = flame_for(run.worst, "profile_run", added=True)[1]
    drawn = render_flame_svg(flame, tmp_path / "f.svg", title="t")
    assert not drawn.rest_panel and drawn.total_bytes == flame.total_bytes
