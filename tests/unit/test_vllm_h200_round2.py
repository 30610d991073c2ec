"""The second round of real vLLM 0.25.1 start-ups on the H200 (tests/data/vllm-h200, issue 11).

- ``startup-stacks/``: the start-up traced with Python stacks under ``memtrace run``;
- ``shared-gpu/``: another process held 128 GiB of the H200, vLLM started at util 0.07 and died in
  ``profile_run``; torch's own OOM message is kept beside the trace (``torch-oom-message.txt``);
- ``cost-pairs.tsv``: vLLM's "init engine" seconds, warm pairs with and without the plugin.
"""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path

from capacity_model import fit
from memtrace.analysis.memory.curves import all_curves
from memtrace.analysis.memory.oom import find_oom
from memtrace.cli import main
from memtrace.facts import VLLM_PLUGINS
from memtrace.store import load_run
from references import summarize
from testdata import unpacked

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm-h200"
GiB = 1 << 30


def _trace(name: str):
    return load_run(unpacked(DATA / name)).traces[0]


def _torch_gib(pattern: str) -> float:
    text = (DATA / "shared-gpu" / "torch-oom-message.txt").read_text()
    return float(re.search(pattern, text).group(1))


def test_shared_gpu_other_process_is_told_apart_as_torch_told_it():
    t = _trace("shared-gpu")
    s = summarize(t)
    # torch: "Process 3266 has 128.60 GiB memory in use. Including non-PyTorch memory, this process has 11.19 GiB"
    assert round(s.peak_others.bytes / GiB, 2) == _torch_gib(r"Process \d+ has ([\d.]+) GiB memory in use")
    curves = all_curves(t)
    ours_at_oom = curves.device_used.at(find_oom(t).time_us)
    assert abs(ours_at_oom / GiB - _torch_gib(r"this process has ([\d.]+) GiB memory in use")) < 0.015
    # this process's non-PyTorch memory is its CUDA context and libraries, not the other 128 GiB
    assert s.peak.non_torch_bytes < 1 * GiB
    assert t.facts["sidecar"]["others_method"] == "per-process"


def test_shared_gpu_oom_record_is_exact_and_first_in_the_report(capsys):
    o = find_oom(_trace("shared-gpu"))
    assert (o.requested_bytes, o.free_bytes) == (
        33_554_432,
        5_832_704,
    )  # "Tried to allocate 32.00 MiB ... 5.56 MiB is free"
    assert o.phase_path == "determine_available_memory/profile_run"
    assert main(["report", str(DATA / "shared-gpu")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("DIED: the process ran out of CUDA memory at")  # the report's first line
    assert "requested 32.00 MiB, device free 5.56 MiB" in " ".join(" ".join(out[0:2]).split())
    assert any(line.lstrip().startswith("DIED: CUDA out of memory") for line in out[3:6])
    assert any("other processes on this GPU held up to 128.60 GiB" in line for line in out)


def test_shared_gpu_crossing_is_in_load_model_and_fits_does_not_blame_non_torch():
    t = _trace("shared-gpu")
    s = summarize(t)
    # util 0.07 of 139.80 GiB = 9.79 GiB, below the 10.49 GiB of weights: crossed while loading them
    assert s.crossing_list[0].phase_path == "load_model"
    f = fit(t, t.process.device_total_bytes)
    # the card alone (the other process's 128.60 GiB left out): the failed 32 MiB request would fit there, but
    # the 9.79 GiB vLLM may fill is less than the weights: vLLM's KV sizing refuses whatever came after the OOM
    # (tests/unit/test_fits_past_the_recording.py); on the room the recording had (card - others) it dies where
    # it died
    assert f.outcome == "no-kv-memory" and f.stage == "KV sizing" and f.recorded_oom is not None
    room = t.process.device_total_bytes - int(t.others["others_bytes"].max())
    f = fit(t, room)
    assert f.outcome == "died" and f.phase == "determine_available_memory/profile_run"


def test_stacks_trace_names_vllms_own_frames_at_the_peak():
    s = summarize(_trace("startup-stacks"), top=5)
    names = [h.frame.name for h in s.holders if h.frame is not None]
    assert names[0] == "_allocate_kv_cache_tensors" and "create_weights" in names
    assert sum(p.stat().st_size for p in (DATA / "startup-stacks").iterdir()) < 2_000_000  # as shipped


def test_stacks_trace_profile_run_added_flame_holds_vllm_frames(tmp_path):
    out = tmp_path / "pr.folded"
    assert (
        main(["flame", str(unpacked(DATA / "startup-stacks")), "--at", "profile_run", "--added", "-o", str(out)]) == 0
    )
    lines = out.read_text().splitlines()
    assert lines and any("vllm/" in line for line in lines)
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) == 856 << 20  # "856.00 MiB added since ..."


def test_memtrace_run_left_vllms_plugins_as_they_were():
    plugins = _trace("startup-stacks").facts[VLLM_PLUGINS]
    assert plugins["VLLM_PLUGINS"] is None  # memtrace run did not set the allow-list
    assert {"lora_filesystem_resolver", "lora_hf_hub_resolver", "memtrace"} <= set(plugins["general"])


def test_cost_pairs_show_no_measurable_cost():
    rows = list(csv.DictReader((DATA / "cost-pairs.tsv").open(), delimiter="\t"))
    assert len(rows) == 3
    ratios = [float(r["with_plugin_s"]) / float(r["without_plugin_s"]) for r in rows]
    assert statistics.median(ratios) <= 1.02
