"""torch 2.14's real ``annotate`` entries (``torch.cuda.memory._annotate_tensor``), recorded on the H200 by
tests/gpu/record_annotations.py (tests/data/snapshots/h200-torch214-annotate): two notes on live tensors beside
``_set_memory_metadata`` labels and ``record_function`` ranges. Every figure is checked against a plain walk of
the pickle (no memtrace code), and import -> ``export -f memory-viz`` -> import keeps them byte for byte."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import numpy as np
from memtrace.analysis.memory.curves import all_curves
from memtrace.cli import main
from memtrace.importers.files import read_snapshot, traces_from_snapshot_file
from memtrace.importers.snapshot import traces_from_snapshot
from memtrace.store import load_trace
from references import snapshot_replay

HERE = Path(__file__).resolve().parents[1] / "data" / "snapshots" / "h200-torch214-annotate"
PICKLE = HERE / "annotated.pickle"
PROFILE = HERE / "prof" / "dp0_pp0_tp0_dcp0_ep0_rank0.1796492061564184358.pt.trace.json.gz"
#: what torch printed on the H200 (record_annotations.out.txt)
ACTIONS = {"alloc": 7, "free_requested": 5, "free_completed": 5, "segment_alloc": 2, "annotate": 2}
NOTES = ["result of step 0", "result of step 1"]


def need(path: Path) -> Path:
    assert path.exists(), f"{path} is not in the checkout (tests/data/snapshots ships it)"
    return path


def _entries() -> list[dict]:
    with open(need(PICKLE), "rb") as f:
        return pickle.load(f)["device_traces"][0]  # the file is ours (recorded on the H200): plain pickle


def _walk():
    """Independent of memtrace: each note, the block live at its address then, and the labels' entry counts."""
    live: dict[int, tuple[int, list]] = {}  # addr -> (size, the alloc's frames)
    notes = []
    for e in _entries():
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e["frames"])
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
        elif e["action"] == "annotate":
            notes.append((e["user_metadata"], e["addr"], e["size"], live[e["addr"]]))
    labels = Counter(e["user_metadata"] for e in _entries() if e["action"] != "annotate" and e["user_metadata"])
    return notes, labels


def test_the_pickle_holds_what_torch_printed_on_the_h200():
    entries = _entries()
    assert Counter(e["action"] for e in entries) == ACTIONS
    assert Counter(e["user_metadata"] for e in entries) == {"step=0": 10, "step=1": 9, **dict.fromkeys(NOTES, 1)}
    assert len(read_snapshot(PICKLE)["external_annotations"]) == 4


def test_each_note_names_the_block_live_at_its_address_as_a_plain_walk_finds_it():
    (trace,) = traces_from_snapshot_file(PICKLE)
    from memtrace.analysis.memory.user_metadata import tensor_notes

    notes, _ = _walk()
    got = tensor_notes(trace)
    assert [(n.text, n.addr, n.size_bytes) for n in got] == [(t, a, s) for t, a, s, _ in notes]
    assert all(n.found and n.size_bytes == size == 4 << 20 for n, (_, _, _, (size, _)) in zip(got, notes, strict=True))
    frame = notes[0][3][1][0]
    assert (got[0].alloc_frame.filename, got[0].alloc_frame.line) == (frame["filename"], frame["line"])
    assert got[0].free_us is not None and got[1].free_us is None  # step 0's result was freed in step 1; not step 1's


def test_the_report_names_the_notes_and_counts_labels_as_the_pickle_does(capsys):
    _, labels = _walk()
    assert main(["report", str(PICKLE)]) == 0
    out = capsys.readouterr().out
    section = out[out.index("User labels") : out.index("Tensor annotations")]
    rows = {ln.split()[0]: int(ln.split()[3]) for ln in section.splitlines() if ln.strip().startswith("step=")}
    assert rows == dict(labels) == {"step=0": 10, "step=1": 9}  # a note is never counted as a label
    notes = out[out.index("Tensor annotations (torch.cuda.memory._annotate_tensor)") :].split("\n\n")[0]
    assert "result of step 0  0.24  4.00 MiB       0.10   0.24  gpu/record_annotations.py:17 <module>" in notes
    assert "result of step 1  0.24  4.00 MiB       0.24      -  gpu/record_annotations.py:17 <module>" in notes


def test_the_flame_graph_names_each_annotated_block_by_its_note(tmp_path):
    assert main(["flame", str(PICKLE), "-f", "folded", "-o", str(tmp_path / "f.folded")]) == 0
    lines = (tmp_path / "f.folded").read_text().splitlines()
    noted = {ln.rsplit(";", 1)[1].rsplit(" ", 1)[0]: int(ln.rsplit(" ", 1)[1]) for ln in lines if "[note]" in ln}
    assert noted == {"[note] result of step 0": 4 << 20, "[note] result of step 1": 4 << 20}
    assert sum(int(ln.rsplit(" ", 1)[1]) for ln in lines) == 48 << 20  # the peak's fullest moment, every byte


def test_the_report_shows_its_holders_at_the_moment_the_flame_graph_shows(tmp_path, capsys):
    """The reserved peak (52 MiB) is reached at 0.11 s; the state both show is its plateau's fullest moment, 0.24 s
    (48 MiB live), one moment in both outputs."""
    assert main(["report", str(PICKLE)]) == 0
    out = capsys.readouterr().out
    assert "reserved 0.05 GiB at 0.11 s in step_0" in out
    assert "Top holders at the reserved peak (0.24 s), by allocating site" in out
    assert main(["flame", str(PICKLE), "-o", str(tmp_path / "f.svg")]) == 0
    assert "Live GPU memory at the reserved peak: 0.243 s, in step_1" in (tmp_path / "f.svg").read_text()


def test_import_and_the_memory_viz_round_trip_keep_every_event_field_and_peak(tmp_path, capsys):
    assert main(["import", str(PICKLE), "-o", str(tmp_path / "a.memtrace")]) == 0
    stored = load_trace(tmp_path / "a.memtrace")
    (direct,) = traces_from_snapshot_file(PICKLE)
    assert np.array_equal(stored.events, direct.events)
    assert main(["export", "-f", "memory-viz", str(tmp_path / "a.memtrace"), "-o", str(tmp_path / "back.pickle")]) == 0
    back_raw = read_snapshot(tmp_path / "back.pickle")
    original = _entries()
    for a, b in zip(original, back_raw["device_traces"][0], strict=True):  # the entries as torch wrote them
        for key in ("action", "addr", "size", "stream", "time_us", "user_metadata", "compile_context"):
            assert a[key] == b[key], key
        assert tuple(b.get("pool_id", (0, 0))) == a["pool_id"]  # the default pool is written by omission
    (back,) = traces_from_snapshot(back_raw)
    assert np.array_equal(back.events, stored.events)
    assert back.facts["snapshot_fields"] == stored.facts["snapshot_fields"]
    from memtrace.analysis.memory.user_metadata import tensor_notes

    assert [n.text for n in tensor_notes(back)] == [n.text for n in tensor_notes(stored)] == NOTES
    a, b = all_curves(stored), all_curves(back)
    peaks = (a.allocated.peak_bytes, a.reserved.peak_bytes)
    assert peaks == (b.allocated.peak_bytes, b.reserved.peak_bytes) == snapshot_replay(read_snapshot(PICKLE), 0)
    assert peaks == (50_331_648, 54_525_952)  # 48 MiB in tensors, 52 MiB in two segments (README table)


def test_the_profile_beside_it_is_rank_0s_and_equals_its_own_totals():
    import gzip
    import json

    from memtrace.importers.kineto import traces_from_kineto_file

    doc = json.load(gzip.open(need(PROFILE), "rt"))
    mem = sorted((e for e in doc["traceEvents"] if e.get("name") == "[memory]" and e["args"]["Device Type"] == 1),
                 key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)))  # fmt: skip
    gpu = next(t for t in traces_from_kineto_file(PROFILE) if t.process.device_index == 0)
    assert gpu.label == "rank 0"  # vLLM's worker name
    curves = all_curves(gpu)
    at = np.flatnonzero(np.isin(gpu.events["action"], (0, 2))) + 1
    assert np.array_equal(curves.allocated.bytes[at], [e["args"]["Total Allocated"] for e in mem])
    assert np.array_equal(curves.reserved.bytes[at], [e["args"]["Total Reserved"] for e in mem])
    assert len(mem) == 5 and (curves.allocated.peak_bytes, curves.reserved.peak_bytes) == (88_080_384, 104_857_600)
