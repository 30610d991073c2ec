"""Multi-rank runs: one file per rank in one run directory, shown per rank with the worst named.

Two kinds of real data: (1) two real processes traced on this CPU machine with memtrace's capture
API (phases and facts, no allocator events: there is no GPU here), writing into one run directory
as ranks 0 and 1; (2) two real H200 traces (the 32 GiB and 44 GiB mimicked cards) placed in one run
directory as ranks 0 and 1 — real allocator data, assembled into a two-rank run for the test (no
two-GPU machine was lent to record a tensor-parallel start-up).
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from memtrace.cli import main
from memtrace.store import load_run
from testdata import unpacked

DATA = Path(__file__).resolve().parents[1] / "data" / "h200"

RANK_PROGRAM = """
import sys, time, memtrace
rank = int(sys.argv[2])
with memtrace.trace(sys.argv[1], rank=rank, world_size=2, sidecar=False):
    with memtrace.phase("init_device"):
        time.sleep(0.01)
    with memtrace.phase("load_model"):
        time.sleep(0.02 * (rank + 1))
"""


def test_two_traced_processes_write_one_file_per_rank_into_one_run(tmp_path):
    run_dir = tmp_path / "run"
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK_PROGRAM, str(run_dir), str(rank)], cwd=tmp_path) for rank in (0, 1)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    files = sorted(p.name for p in run_dir.glob("*.memtrace"))
    assert len(files) == 2 and files[0].endswith("-rank0.memtrace") and files[1].endswith("-rank1.memtrace")
    run = load_run(run_dir)
    assert [t.process.rank for t in run.traces] == [0, 1]
    assert all(t.process.world_size == 2 for t in run.traces)
    assert {t.process.pid for t in run.traces} == {p.pid for p in procs}
    for t in run.traces:
        assert [p.name for p in t.phases] == ["init_device", "load_model"]
        assert all(p.end_us is not None and p.end_us >= p.start_us for p in t.phases)


def _two_rank_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "tp2"
    run_dir.mkdir()
    for rank, name in enumerate(["startup-cap32g", "startup-cap44g"]):
        src = next(unpacked(DATA / name).glob("*.memtrace"))
        dst = run_dir / f"vm-pid{1000 + rank}-rank{rank}.memtrace"
        shutil.copy(src, dst)
        db = sqlite3.connect(dst)
        with db:
            (doc,) = db.execute("SELECT value FROM meta WHERE key='process'").fetchone()
            import json

            process = json.loads(doc)
            process.update(rank=rank, local_rank=rank, world_size=2, pid=1000 + rank)
            db.execute("UPDATE meta SET value=? WHERE key='process'", (json.dumps(process),))
        db.close()
    return run_dir


def test_report_shows_every_rank_and_names_the_worst(tmp_path, capsys):
    run_dir = _two_rank_run(tmp_path)
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "rank 0" in out and "rank 1" in out
    # rank 1 stood for the 44 GiB card: its peak reserved (42.53 GiB) is the larger one
    assert "worst" in out.lower() and "rank 1" in out.lower().split("worst", 1)[1][:200]


def test_fits_answers_for_every_rank_and_names_the_worst(tmp_path, capsys):
    run_dir = _two_rank_run(tmp_path)
    code = main(["fits", str(run_dir), "--capacity", "16GiB"])
    out = capsys.readouterr().out
    assert code == 1  # neither rank fits on 16 GiB
    assert "(rank 0)" in out and "(rank 1)" in out
    assert "Worst rank: rank 1" in out


def test_fits_for_one_rank_only(tmp_path, capsys):
    run_dir = _two_rank_run(tmp_path)
    main(["fits", str(run_dir), "--capacity", "16GiB", "--rank", "0"])
    out = capsys.readouterr().out
    assert "(rank" not in out and "Worst rank" not in out


@pytest.mark.parametrize("command", [["plot", "-o", "t.png"], ["flame", "-o", "f.svg"]])
def test_plot_and_flame_accept_a_rank_of_a_multi_rank_run(tmp_path, command):
    run_dir = _two_rank_run(tmp_path)
    argv = [command[0], str(run_dir), command[1], str(tmp_path / command[2]), "--rank", "1"]
    assert main(argv) == 0
    assert (tmp_path / command[2]).stat().st_size > 1000
