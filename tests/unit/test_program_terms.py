"""A program that is not vLLM is answered in its own terms, and each quantity has one name in every output
(issue 32, defects 6 and 7), on real files: the public PyTorch 2.0 training snapshot in tests/data/snapshots
and the H200's vLLM start-ups."""

from __future__ import annotations

import json
from pathlib import Path

from memtrace.analysis.holders.flame import BEFORE_RECORDING, VMM_KV
from memtrace.analysis.memory import quantities as Q
from memtrace.cli import main
from memtrace.plots.palette import VMM_KV_LABEL
from testdata import unpacked

DATA = Path(__file__).resolve().parents[1] / "data"
TRAINING = DATA / "snapshots" / "torch20-no-time.pickle"  # a training step's history, no vLLM in it


def test_fits_on_a_training_snapshot_says_no_vllm_words(capsys):
    """Defect 7: fits on a training snapshot printed "at --gpu-memory-utilization 0.9 (vLLM may fill 21.60
    GiB)", "card-independent: peak 19.97 GiB" (a 'peak' 1 GiB below the report's reserved peak) and "fits on
    at that utilization"."""
    assert main(["fits", str(TRAINING), "--capacity", "24GiB"]) == 0
    out = capsys.readouterr().out
    assert "vLLM" not in out and "utilization" not in out and "KV sizing" not in out
    assert "On a 24.00 GiB card:\n  FITS" in out and "4.03 GiB to spare" in out
    assert "it needs at most 19.97 GiB" in out and "peak 19.97" not in out
    assert "Smallest card this program fits on: about 19.98 GiB" in out
    assert main(["fits", str(TRAINING), "--capacity", "24GiB,16GiB"]) == 1
    out = capsys.readouterr().out
    assert "vLLM fills" not in out and "non-KV" not in out and "before KV sizing" not in out
    assert "16.00 GiB  OOM outside any phase (needs 3.97 GiB more)" in out  # nothing invents "before the first phase"
    assert main(["fits", str(TRAINING), "--capacity", "24GiB", "--json"]) == 0
    (answer,) = json.loads(capsys.readouterr().out)["fits"]
    assert answer["capacity_bytes"] - answer["headroom_bytes"] == answer["pre_kv_peak_bytes"] == 21_443_379_200


def test_report_of_a_training_snapshot_has_no_non_kv_line(capsys):
    assert main(["report", str(TRAINING)]) == 0
    out = capsys.readouterr().out
    assert "non-KV" not in out and "vLLM" not in out and "reserved 20.97 GiB" in out


def test_a_quantity_is_framed_in_the_flame_and_named_in_the_legend_by_its_one_label():
    """Defect 6: the report said "(present before recording began)" where the flame and the view said
    "[allocated before recording]"; the flame framed the VMM KV cache "[KV cache outside PyTorch, CUDA VMM]"
    and the timeline's legend and the view "KV cache (CUDA VMM, outside PyTorch)": three spellings of one
    quantity."""
    assert BEFORE_RECORDING == f"[{Q.BEFORE_RECORDING.label}]" == "[present before recording began]"
    assert VMM_KV == f"[{Q.VMM.label}]" and VMM_KV_LABEL == Q.VMM.label == "KV cache outside PyTorch (CUDA VMM)"


def test_the_report_and_the_flame_give_memory_before_recording_the_same_name_and_bytes(tmp_path, capsys):
    run = unpacked(DATA / "vllm-h200" / "startup")  # 0.25.1: 26 blocks (33,923,632 B) present before recording began
    assert main(["report", str(run)]) == 0
    report = capsys.readouterr().out
    assert "    0.03    0.0%      26       1  (present before recording began)" in report
    out = tmp_path / "f.folded"
    assert main(["flame", str(run), "-f", "folded", "-o", str(out)]) == 0
    folded = dict(line.rsplit(" ", 1) for line in out.read_text().splitlines())
    assert int(folded["[present before recording began]"]) == 33_923_632


def test_the_headline_of_a_0_34_run_names_what_the_process_held_as_the_report_does(capsys):
    """The view's and the issue bundle's first sentence said "PyTorch reserved peaked at 11.73 GiB, 128.07 GiB
    below the target" for moe-ext, whose KV cache (126 GiB, outside PyTorch) filled the card, and 99.04 GiB below
    for small-ext beside a 96.6 GiB neighbour; the report's Target section says held, and the card's own fill."""
    from memtrace.analysis.analysed.run import analyse
    from memtrace.plots.verdict_text import headline
    from memtrace.store import load_run
    from vllm034_data import run_dir

    moe, small = (analyse(load_run(run_dir(s)).traces) for s in ("moe-ext", "small-ext"))
    assert headline(moe) == (
        "Within the target: held by this process peaked at 137.35 GiB, 2.45 GiB below the target (139.80 GiB)."
    )
    assert headline(small).endswith(
        "99.04 GiB below the target (139.80 GiB); with other processes' memory the card held up to 138.11 GiB, "
        "1.69 GiB below it."
    )
    main(["report", str(run_dir("small-ext"))])
    report = capsys.readouterr().out
    assert "stays 99.04 GiB below it" in report and "held up to 138.11 GiB, 1.69 GiB" in report
