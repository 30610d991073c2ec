"""What a torch snapshot holds beyond a history is read, and said: the allocator's state alone (one moment,
no timeline), a history whose state was left out ('segments: []': lower bounds), unknown actions (counted,
with their bytes), compile_context / user_metadata / annotate payloads / pool_id (kept through import and
export -f memory-viz), pinned host memory (its own trace). Real files from tests/data/snapshots; where a
variant is derived in memory from one of them the test says how."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
from memtrace.analysis.memory.curves import all_curves
from memtrace.cli import main
from memtrace.importers.files import read_snapshot, traces_from_snapshot_file
from memtrace.importers.snapshot import traces_from_snapshot
from memtrace.importers.torch_snapshot import MOMENT_NOTE, NO_STATE_NOTE
from memtrace.plots.memory_viz import write_snapshot
from memtrace.store import load_trace, save_trace
from references import snapshot_dict

SNAPS = Path(__file__).resolve().parents[1] / "data" / "snapshots"
STATE = SNAPS / "state-only.pickle"
PY = SNAPS / "python-stacks.pickle"
MULTI = SNAPS / "multi-device-oom.pickle"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path.name} is not shipped")
    return path


def _seg_totals(raw_segments, device=0):
    segs = [s for s in raw_segments if s.get("device", 0) == device]
    reserved = sum(s["total_size"] for s in segs)
    held = sum(b["requested_size"] for s in segs for b in s["blocks"] if b["state"].startswith("active"))
    return reserved, held


def test_a_state_only_snapshot_is_one_moment_with_the_snapshots_own_totals(capsys):
    raw = read_snapshot(need(STATE))
    reserved, held = _seg_totals(raw["segments"])
    (trace,) = traces_from_snapshot_file(STATE)
    assert trace.facts["import"]["state"] == "moment" and trace.facts["import"]["clock"] == "none"
    curves = all_curves(trace)
    assert curves.reserved.peak_bytes == reserved == 11_844_714_496
    assert curves.allocated.peak_bytes == held == 11_840_159_744
    assert trace.recording.start_us is None and trace.phases == []
    assert main(["report", str(STATE)]) == 0
    out, err = capsys.readouterr()
    assert "one moment" in err and "no timeline" in MOMENT_NOTE
    assert "0 allocator events" in out and "1970" not in out  # the 'snapshot' marker is not an event
    assert "flexgen/pytorch_backend.py:190 allocate" in out  # stacks from the blocks' old 'history' field


def test_two_states_diff_and_fit_as_moments(tmp_path, capsys):
    (trace,) = traces_from_snapshot_file(need(STATE))
    save_trace(trace, tmp_path / "a.memtrace")
    assert main(["diff", str(tmp_path / "a.memtrace"), str(STATE)]) == 0
    assert main(["fits", str(STATE), "--capacity", "12GiB,8GiB", "--json"]) in (0, 1)
    out = capsys.readouterr().out
    assert "11_844_714_496" in out.replace(",", "_") or "11844714496" in out


def test_import_of_a_device_with_state_only_says_so_and_imports_it(tmp_path, monkeypatch, capsys):
    raw = read_snapshot(need(MULTI))
    raw["device_traces"][0] = []  # derived: cuda:0's history removed, its segments kept
    src = tmp_path / "derived.pickle"
    src.write_bytes(pickle.dumps(raw, protocol=4))
    monkeypatch.chdir(tmp_path)
    assert main(["import", str(src), "-o", "one.memtrace"]) == 2
    assert "cuda:0 (allocator state only), cuda:1 (history), cuda:2 (history)" in capsys.readouterr().err
    assert main(["import", str(src), "--device", "0", "-o", "c0.memtrace"]) == 0
    t = load_trace(tmp_path / "c0.memtrace")
    assert t.facts["import"]["state"] == "moment" and len(t.segments) == 2


def test_a_history_without_its_segments_is_a_lower_bound_and_says_so(capsys):
    raw = read_snapshot(need(PY))
    (whole,) = traces_from_snapshot(raw)
    raw["segments"] = []  # derived: the same real history as a converter writes it, 'segments: []'
    (bare,) = traces_from_snapshot(raw)
    assert whole.facts["import"]["state"] == "recorded" and not any(n.text == NO_STATE_NOTE for n in whole.notes)
    assert bare.facts["import"]["state"] == "missing"
    assert [n.level for n in bare.notes if n.text == NO_STATE_NOTE] == ["warning"]
    low, true = all_curves(bare).allocated.peak_bytes, all_curves(whole).allocated.peak_bytes
    assert low < true  # what the note warns about: the figure is below the truth
    assert "lower bound" in NO_STATE_NOTE and "not the peak" in NO_STATE_NOTE


def test_without_its_segments_reserved_is_at_least_allocated_and_the_report_says_so(tmp_path, capsys):
    """Issue 32 defect 8: python-stacks' history holds allocs and frees only, so with 'segments: []' the
    reserved curve read 0 B under 5.70 GiB allocated ("reserved at least 0.00 GiB"), its peak sat at the
    first event with no holders, and the report warned that events "do not add up to the final allocator
    state" (there is none). Live tensors sit in segments: reserved is at least allocated, a lower bound."""
    raw = read_snapshot(need(PY))
    raw["segments"] = []  # derived as above
    src = tmp_path / "noseg.pickle"
    src.write_bytes(pickle.dumps(raw, protocol=4))
    (bare,) = traces_from_snapshot(raw)
    c = all_curves(bare)
    assert (c.reserved.bytes >= c.allocated.bytes).all()
    assert c.reserved.peak_bytes == c.allocated.peak_bytes == 6_124_437_508
    assert main(["report", str(src)]) == 0
    out = capsys.readouterr().out
    assert "reserved at least 5.70 GiB" in out and "reserved at least 0.00 GiB" not in out
    assert "do not add up" not in out and "a lower bound" in out
    holders = out.split("by allocating site")[1].split("\n\n")[0]
    assert "(present before recording began)" in holders  # the peak has its holders


def _annotated_variant():
    """python-stacks.pickle with torch 2.14's fields added in memory: user_metadata on ten entries, a pool
    id on five, an 'annotate' entry with its payload, and an action no torch writes today."""
    raw = read_snapshot(need(PY))
    e = raw["device_traces"][0]
    for x in e[100:110]:
        x["user_metadata"] = "step=3"
    for x in e[200:205]:
        x["pool_id"] = (1, 7)
    e[150]["compile_context"] = "[0/0] forward"
    e.insert(300, dict(e[299], action="annotate", user_metadata="kv_cache layer 3", size=0))
    e.insert(400, dict(e[399], action="future_thing", size=123_456_789))
    return raw


def test_an_unknown_action_is_named_with_its_bytes(capsys):
    (trace,) = traces_from_snapshot(_annotated_variant())
    assert trace.facts["import"]["unknown_actions"] == {"future_thing": [1, 123_456_789]}
    (note,) = [n for n in trace.notes if "future_thing" in n.text]
    assert note.level == "warning" and "123,456,789 B" in note.text


def test_fields_survive_import_export_import_byte_for_byte(tmp_path):
    (trace,) = traces_from_snapshot(_annotated_variant())
    fields = trace.facts["snapshot_fields"]
    assert fields["values"] == [
        ["N/A", "step=3", [0, 0]],
        ["[0/0] forward", "", [0, 0]],
        ["N/A", "", [1, 7]],
        ["N/A", "kv_cache layer 3", [0, 0]],
    ]
    save_trace(trace, tmp_path / "t.memtrace")
    stored = load_trace(tmp_path / "t.memtrace")
    buf = io.BytesIO()
    write_snapshot(stored, buf)
    streamed = pickle.loads(buf.getvalue())
    for snap in (streamed, pickle.loads(pickle.dumps(snapshot_dict(stored), protocol=4))):
        entries = snap["device_traces"][0]
        assert [x["user_metadata"] for x in entries if x["action"] == "annotate"] == ["kv_cache layer 3"]
        assert [x.get("pool_id") for x in entries[199:206]] == [None] + [(1, 7)] * 5 + [None]
        (back,) = traces_from_snapshot(snap)
        assert np.array_equal(back.events, trace.events)
        assert back.facts["snapshot_fields"] == fields
        a, b = all_curves(trace), all_curves(back)
        assert (a.allocated.peak_bytes, a.reserved.peak_bytes) == (b.allocated.peak_bytes, b.reserved.peak_bytes)
        assert np.array_equal(a.reserved.bytes, b.reserved.bytes)


def test_pinned_host_memory_is_its_own_trace_never_a_device(tmp_path):
    raw = read_snapshot(need(PY))
    host_entries = raw["device_traces"][0][:400]  # derived: a real history's first entries as host history
    raw["host_traces"], raw["host_segments"] = host_entries, []
    traces = traces_from_snapshot(raw)
    assert [t.label for t in traces] == ["rank 0", "pinned host"]
    device, host = traces
    (alone,) = traces_from_snapshot({k: v for k, v in raw.items() if not k.startswith("host_")})
    assert np.array_equal(all_curves(device).allocated.bytes, all_curves(alone).allocated.bytes)
    assert host.process.device_index is None and host.facts["import"]["memory"] == "pinned host"
    snap = pickle.loads(pickle.dumps(snapshot_dict(host), protocol=4))
    assert snap["device_traces"] == [] and len(snap["host_traces"]) == len(host.events)
    (back,) = traces_from_snapshot(snap)
    assert back.label == "pinned host" and np.array_equal(back.events, host.events)


@pytest.mark.parametrize("name", ["h200-state-only.pickle", "h200-state-only-expandable.pickle"])
def test_h200_state_only_snapshots_equal_torchs_own_counters(name):
    """Recorded on the H200 (torch 2.14, tests/gpu/record_profiler_files.py): ``_memtrace_counters`` is
    torch.cuda.memory_allocated() / memory_reserved() read when the snapshot was taken."""
    raw = read_snapshot(need(SNAPS / name))
    counters = raw["_memtrace_counters"]
    (trace,) = traces_from_snapshot(raw)
    curves = all_curves(trace)
    assert trace.facts["import"]["state"] == "moment"
    assert curves.reserved.peak_bytes == counters["reserved"]
    blocks = sum(b.size_bytes for s in trace.segments for b in s.blocks if b.state.startswith("active"))
    assert blocks == counters["allocated"]  # torch counts block sizes; memtrace's allocated is requested bytes
    assert curves.allocated.peak_bytes == 136_314_880


GPU_214 = Path(__file__).resolve().parents[1] / "data" / "snapshots" / "h200-torch214" / "history.pickle"


def test_h200_torch214_pinned_host_history_is_its_own_trace():
    device, host = traces_from_snapshot_file(GPU_214)
    assert device.label == "rank 0" and host.label == "pinned host"
    assert all_curves(host).allocated.peak_bytes == 4 << 20  # the script's 4 MiB pinned buffer
    assert {v[1] for v in device.facts["snapshot_fields"]["values"]} >= {"step=0", "step=1", "step=2"}
