"""Exact curves from hand-built PyTorch snapshot dicts, one behaviour of the allocator per test."""

from __future__ import annotations

import numpy as np
from memtrace.analysis.holders.live import live_allocations_at
from memtrace.analysis.memory.curves import all_curves
from memtrace.model import SAMPLE_DTYPE
from references import allocated_curve, baseline, reserved_curve, trace_from_snapshot

MiB = 1 << 20
SEG = 0x7F0000000000


def entry(t, action, addr, size, line=0):
    frames = [{"filename": "/app/model.py", "line": line, "name": f"layer{line}"}] if line else []
    return {"time_us": t, "action": action, "addr": addr, "size": size, "stream": 0, "frames": frames}


def snapshot(entries, segments=()):
    return {"segments": list(segments), "device_traces": [list(entries)], "external_annotations": []}


def test_allocated_counts_a_block_until_free_completed_not_free_requested():
    tr = trace_from_snapshot(
        snapshot(
            [
                entry(10, "segment_alloc", SEG, 20 * MiB, 1),
                entry(11, "alloc", SEG, 5 * MiB + 3, 1),
                entry(12, "free_requested", SEG, 5 * MiB + 3),
                entry(13, "free_completed", SEG, 5 * MiB + 3),
            ]
        )
    )
    alloc = allocated_curve(tr)
    assert [alloc.at(t) for t in (10, 11, 12, 13)] == [0, 5 * MiB + 3, 5 * MiB + 3, 0]


def test_reserved_follows_segment_alloc_and_free():
    tr = trace_from_snapshot(
        snapshot([entry(10, "segment_alloc", SEG, 20 * MiB, 1), entry(20, "segment_free", SEG, 20 * MiB)])
    )
    res = reserved_curve(tr)
    assert (res.at(15), res.at(20), res.peak_bytes) == (20 * MiB, 0, 20 * MiB)


def test_expandable_segment_map_and_unmap_move_reserved():
    tr = trace_from_snapshot(
        snapshot(
            [
                entry(10, "segment_map", SEG, 2 * MiB, 1),
                entry(11, "segment_map", SEG + 2 * MiB, 6 * MiB, 1),
                entry(12, "segment_unmap", SEG + 2 * MiB, 6 * MiB),
            ]
        )
    )
    res = reserved_curve(tr)
    assert [res.at(t) for t in (10, 11, 12)] == [2 * MiB, 8 * MiB, 2 * MiB]
    assert res.peak_bytes == 8 * MiB


def test_baseline_segments_from_before_recording_are_reconstructed_from_the_final_state():
    before = {
        "address": SEG,
        "total_size": 64 * MiB,
        "stream": 0,
        "segment_type": "large",
        "blocks": [
            {"address": SEG, "size": 8 * MiB, "requested_size": 8 * MiB - 100, "state": "active_allocated"},
            {"address": SEG + 8 * MiB, "size": 56 * MiB, "requested_size": 0, "state": "inactive"},
        ],
    }
    tr = trace_from_snapshot(
        snapshot(
            [
                entry(10, "segment_alloc", SEG + (1 << 30), 2 * MiB, 1),
                entry(11, "alloc", SEG + (1 << 30), MiB, 1),
                entry(12, "free_completed", SEG + (1 << 30), MiB),
                entry(13, "segment_free", SEG + (1 << 30), 2 * MiB),
            ],
            [before],
        )
    )
    base = baseline(tr)
    assert (base.allocated_bytes, base.reserved_bytes, base.consistent) == (8 * MiB - 100, 64 * MiB, True)
    assert reserved_curve(tr).peak_bytes == 66 * MiB
    assert allocated_curve(tr).peak_bytes == 9 * MiB - 100


def test_truncated_history_with_final_state_starts_from_the_reconstructed_level():
    # The ring buffer dropped the alloc of a 4 MiB block; its free is the first entry left.
    seg = {"address": SEG, "total_size": 32 * MiB, "stream": 0, "segment_type": "large", "blocks": []}
    tr = trace_from_snapshot(
        snapshot(
            [
                entry(10, "free_completed", SEG, 4 * MiB),
                entry(11, "alloc", SEG, MiB, 2),
                entry(12, "free_completed", SEG, MiB),
            ],
            [seg],
        )
    )
    alloc = allocated_curve(tr)
    assert [alloc.at(t) for t in (9, 10, 11, 12)] == [0, 0, MiB, 0]
    assert alloc.bytes[0] == 4 * MiB  # the baseline point: the dropped block was live before
    assert baseline(tr).consistent


def test_truncated_history_without_final_state_never_goes_negative():
    tr = trace_from_snapshot(snapshot([entry(10, "free_completed", SEG, 4 * MiB), entry(11, "alloc", SEG, MiB, 2)]))
    tr.segments = []  # a capture that saved no final state
    base = baseline(tr)
    assert (base.allocated_bytes, base.consistent) == (4 * MiB, False)
    assert allocated_curve(tr).bytes.min() == 0


def test_times_that_step_back_keep_event_order_and_a_searchable_axis():
    tr = trace_from_snapshot(
        snapshot([entry(10, "segment_alloc", SEG, 2 * MiB, 1), entry(9, "segment_alloc", SEG + 2 * MiB, 2 * MiB, 1)])
    )
    res = reserved_curve(tr)
    assert np.all(np.diff(res.time_us) >= 0)
    assert res.at(10) == 4 * MiB


def test_all_curves_non_torch_is_device_used_minus_reserved_at_each_sample():
    tr = trace_from_snapshot(
        snapshot([entry(10, "segment_alloc", SEG, 2 * MiB, 1), entry(20, "segment_free", SEG, 2 * MiB)])
    )
    tr.samples = np.array([(5, 500 * MiB), (15, 503 * MiB), (25, 501 * MiB)], dtype=SAMPLE_DTYPE)
    c = all_curves(tr)
    assert c.has_device
    assert c.non_torch.bytes.tolist() == [500 * MiB, 501 * MiB, 501 * MiB]
    assert c.device_used.peak_bytes == 503 * MiB


def test_live_bytes_equal_the_allocated_curve_after_every_event():
    rng = np.random.default_rng(7)
    entries, live, t = [], {}, 0
    for _ in range(400):
        t += int(rng.integers(0, 3))  # equal timestamps happen
        if live and rng.random() < 0.45:
            addr = list(live)[int(rng.integers(len(live)))]
            entries.append(entry(t, "free_requested", addr, live[addr]))
            entries.append(entry(t, "free_completed", addr, live.pop(addr)))
        else:
            addr = SEG + int(rng.integers(0, 1 << 20)) * 512
            if addr in live:
                continue
            live[addr] = int(rng.integers(1, 1 << 22))
            entries.append(entry(t, "alloc", addr, live[addr], int(rng.integers(1, 20))))
    tr = trace_from_snapshot(snapshot(entries))
    alloc = allocated_curve(tr)
    for i in range(len(tr.events)):
        assert sum(a.size_bytes for a in live_allocations_at(tr, event_index=i)) == alloc.bytes[i + 1]
    for t_us in range(0, t + 1, 7):
        assert sum(a.size_bytes for a in live_allocations_at(tr, t_us)) == alloc.at(t_us)


def test_held_is_reserved_plus_what_cuda_vmm_committed():
    from memtrace.analysis.memory.curves import Curve, sum_curves

    reserved = Curve(np.array([1, 3, 3, 5]), np.array([1, 2, 4, 0]))
    vmm = Curve(np.array([2, 3]), np.array([10, 20]))
    held = sum_curves(reserved, vmm)
    assert held.time_us.tolist() == [1, 2, 3, 5]
    assert held.bytes.tolist() == [1, 11, 24, 20]  # the later of equal times wins
    assert sum_curves(reserved, Curve(np.zeros(0, np.int64), np.zeros(0, np.int64))) is reserved
