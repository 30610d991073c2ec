"""The timeline splits its non-PyTorch band with what CUPTI saw, over the real H200 vLLM start-up
recorded with CUPTI (tests/data/vllm-h200/startup-cupti, 1,745 records): the CUPTI part drawn at the
first crossing is ``non_torch.breakdown``'s ``cupti_bytes`` to the byte, the rest up to NVML device
used is never drawn negative, and a trace without records is drawn as before (no CUPTI artist).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from memtrace.analysis.memory import non_torch as nt
from memtrace.analysis.memory.curves import Curve, all_curves
from memtrace.plots.downsample import bucket_indices
from memtrace.plots.timeline import render_timeline
from memtrace.plots.timeline_axes import N_BUCKETS, zoom_window
from memtrace.plots.timeline_data import cupti_split, prepare_rank
from memtrace.store import load_trace
from testdata import DATA, analysed_rank, unpacked

CUPTI_TRACE = unpacked(DATA / "vllm-h200" / "startup-cupti" / "vm-pid1909-rank0.memtrace")
PLAIN_TRACE = unpacked(DATA / "vllm-h200" / "startup" / "vm-pid1568-rank0.memtrace")
SEEN = "non-PyTorch seen by CUPTI (exact)"
UNEXPLAINED = "non-PyTorch unexplained (NVML used - reserved - CUPTI)"
BAND = "non-PyTorch (NVML used - reserved)"


@pytest.fixture(scope="module")
def trace():
    return load_trace(CUPTI_TRACE)


@pytest.fixture(scope="module")
def rank(trace):
    return prepare_rank(analysed_rank(trace))


def _drawn_split(rank, lo: int, hi: int, n_buckets: int):
    """The split as ``timeline_axes._lines`` draws it over [lo, hi] (the same NVML samples kept)."""
    used = rank.curves.device_used
    return cupti_split(rank, bucket_indices(used.time_us, used.bytes, lo, hi, n_buckets), lo, hi, n_buckets)


def _value_at(split, t_us: int) -> tuple[int, int, int]:
    i = int(np.searchsorted(split.time_us, t_us, side="right")) - 1
    return int(split.reserved_bytes[i]), int(split.cupti_bytes[i]), int(split.used_bytes[i])


def test_rank_carries_the_analysis_live_curve(trace, rank):
    live = nt.live_curve(trace)
    assert np.array_equal(rank.cupti.time_us, live.time_us)
    assert np.array_equal(rank.cupti.bytes, live.bytes)


@pytest.mark.parametrize("panel", ["main", "zoom"])
def test_cupti_part_at_the_first_crossing_is_the_breakdowns_bytes(trace, rank, panel):
    c = rank.first_crossing()
    b = nt.breakdown(trace, c.time_us, "first crossing", curves=all_curves(trace))
    assert b.cupti_bytes == 68_362_212  # 65.20 MiB of 0.75 GiB non-PyTorch
    lo, hi = (rank.start_us, rank.end_us) if panel == "main" else zoom_window(rank)
    split = _drawn_split(rank, lo, hi, N_BUCKETS if panel == "main" else 600)
    reserved, cupti, used = _value_at(split, c.time_us)
    assert cupti == b.cupti_bytes
    # the band's edges are the figures the band had without CUPTI: NVML used and used - non-PyTorch
    assert used == rank.curves.device_used.at(c.time_us)
    assert used - reserved == rank.curves.non_torch.at(c.time_us)
    assert used - reserved - cupti > 0


def test_unexplained_part_is_never_drawn_negative(rank):
    # CUPTI's curve blown up past NVML's non-PyTorch: the drawing is clipped, never the other way round
    big = dataclasses.replace(rank, cupti=Curve(rank.cupti.time_us, rank.cupti.bytes * 64))
    split = _drawn_split(big, big.start_us, big.end_us, N_BUCKETS)
    room = np.maximum(split.used_bytes - split.reserved_bytes, 0)
    assert (split.cupti_bytes >= 0).all()
    assert (split.cupti_bytes <= room).all()
    assert (split.used_bytes - split.cupti_top_bytes >= 0).all()
    assert (split.cupti_bytes == room).any()  # the clip did bite


def test_legend_names_both_parts_and_the_svg_holds_the_cupti_band(rank, tmp_path):
    drawn = render_timeline([rank], tmp_path / "t.svg")
    assert SEEN in drawn.legend and UNEXPLAINED in drawn.legend
    assert BAND not in drawn.legend
    assert drawn.legend.index(SEEN) == drawn.legend.index(UNEXPLAINED) - 1  # stacked in that order
    svg = (tmp_path / "t.svg").read_text()
    assert svg.count('id="non_torch_cupti"') == 2  # the main plot and the zoom panel
    assert svg.count('id="non_torch_unexplained"') == 2


def test_a_trace_without_records_gets_no_cupti_artist(tmp_path):
    plain = prepare_rank(analysed_rank(load_trace(PLAIN_TRACE)))
    assert plain.cupti is None
    drawn = render_timeline([plain], tmp_path / "t.svg")
    assert BAND in drawn.legend
    assert SEEN not in drawn.legend and UNEXPLAINED not in drawn.legend
    svg = (tmp_path / "t.svg").read_text()
    assert "non_torch_cupti" not in svg and "non_torch_unexplained" not in svg


def test_ranks_with_and_without_records_name_both_bands(rank, tmp_path):
    plain = prepare_rank(analysed_rank(load_trace(PLAIN_TRACE)))
    drawn = render_timeline([rank, plain], tmp_path / "t.png")
    assert [label for label in drawn.legend if label.startswith("non-PyTorch")] == [SEEN, UNEXPLAINED, BAND]
