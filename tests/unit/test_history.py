"""memtrace history: a run store for CI, on the real H200 traces (tests/data/h200, tests/data/vllm-h200)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from memtrace.analysis.gate.history import figures_doc, figures_from_doc, record
from memtrace.cli import main
from memtrace.history_store import VERSION
from memtrace.store import load_run
from memtrace.units import parse_threshold
from references import diff_traces
from testdata import unpacked

DATA = Path(__file__).resolve().parents[1] / "data"
FULL, WS1G = DATA / "h200" / "startup-full", DATA / "h200" / "startup-ws1g"
CAP32, CAP6 = DATA / "h200" / "startup-cap32g", DATA / "h200" / "startup-cap6g"
VLLM = unpacked(DATA / "vllm-h200" / "startup")
GiB = 1 << 30


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["history", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def db(tmp_path, capsys) -> Path:
    path = tmp_path / "h.sqlite"
    assert _run(capsys, "add", FULL, "--db", path)[0] == 0
    return path


def test_check_of_the_workspace_extra_run_against_full_exits_1(db, capsys):
    rc, out, _ = _run(capsys, "check", WS1G, "--db", db)
    assert rc == 1
    assert out.startswith(f"memtrace history check: {db} run #1 (startup-full) → {WS1G}")
    assert "memory before KV sizing: 5.40 GiB → 6.40 GiB (+1.00 GiB" in out
    assert "phase profile_run: 7.75 GiB → 8.75 GiB (+1.00 GiB" in out
    assert "FAIL: 3 figure(s) grew more than 2% (exit 1)" in out
    assert _run(capsys, "check", FULL, "--db", db)[0] == 0
    assert _run(capsys, "check", WS1G, "--db", db, "--fail-over", "1.5GiB")[0] == 0


def test_check_gives_the_same_verdict_and_figures_as_diff(db, capsys):
    rc, out, _ = _run(capsys, "check", WS1G, "--db", db, "--json")
    hist = json.loads(out)["traces"][0]
    direct = diff_traces(load_run(FULL).traces[0], load_run(WS1G).traces[0], parse_threshold("2%"))
    assert hist["failed"] is direct.failed is True
    assert [(c["label"], c["base_bytes"], c["new_bytes"]) for c in hist["regressions"]] == [
        (c.label, c.base, c.new) for c in direct.regressions
    ]
    assert [(c["label"], c["new_bytes"]) for c in hist["headline"]] == [(c.label, c.new) for c in direct.headline]


def test_a_refused_run_is_stored_but_never_becomes_the_reference(db, capsys):
    rc, out, _ = _run(capsys, "check", WS1G, "--db", db, "--add")
    assert rc == 1 and "recorded in" in out and "as refused" in out
    # checked again, ws1g is still compared with full (the refused run is no reference): it fails again
    assert _run(capsys, "check", WS1G, "--db", db)[0] == 1
    rows = sqlite3.connect(db).execute("SELECT batch, label, accepted FROM runs ORDER BY id").fetchall()
    assert rows == [(1, "startup-full", 1), (2, "startup-ws1g", 0)]
    # accepting it (an intended growth) makes it the reference: now ws1g passes against itself
    assert _run(capsys, "accept", "2", "--db", db)[0] == 0
    assert _run(capsys, "check", WS1G, "--db", db)[0] == 0
    assert _run(capsys, "check", FULL, "--db", db)[0] == 0  # shrinking never fails


def test_a_run_of_another_key_is_not_passed_and_names_the_closest_key(db, capsys):
    # issue 32 defect 5: it said "nothing to compare" on stdout and exited 0 (1 only with --strict)
    rc, out, err = _run(capsys, "check", CAP32, "--db", db)
    assert rc == 1 and out == ""
    assert "nothing compared, not passed (exit 1; --allow-new for a new environment)" in err
    assert "differs in: card_bytes — → 34359738368" in err
    rc, out, err = _run(capsys, "check", CAP32, "--db", db, "--json")
    assert rc == 1 and json.loads(out)["failed"] is True and "nothing compared" in err
    assert _run(capsys, "check", CAP32, "--db", db, "--allow-new")[0] == 0


def test_an_older_trace_lacking_the_kv_sizing_fact_is_checked_against_a_newer_one(tmp_path, capsys):
    # issue 32 defect 5: startup (recorded before the plugin wrote how vLLM sized the KV cache) and
    # startup-stacks (same GPU, versions, model, flags) had two keys: "kv_cache_sizing — → profiling"
    path = tmp_path / "h.sqlite"
    assert _run(capsys, "add", VLLM, "--db", path)[0] == 0
    rc, out, err = _run(capsys, "check", unpacked(DATA / "vllm-h200" / "startup-stacks"), "--db", path)
    assert rc == 0 and "nothing compared" not in err
    assert out.startswith(f"memtrace history check: {path} run #1 (startup) → ") and "OK: nothing grew" in out


def test_the_same_recording_added_twice_is_one_run(db, capsys):
    # issue 32 defect 5: a second `add` of the same file stored a second run
    rc, out, _ = _run(capsys, "add", FULL, "--db", db)
    assert rc == 0 and "already in" in out and "as run #1 (the same recording)" in out
    rc, out, _ = _run(capsys, "check", FULL, "--db", db, "--add")
    assert rc == 0 and "not added again" in out
    rows = sqlite3.connect(db).execute("SELECT batch, label, accepted FROM runs ORDER BY id").fetchall()
    assert rows == [(1, "startup-full", 1)]


def test_a_refused_first_run_gated_again_with_allow_new_becomes_the_reference(tmp_path, capsys):
    path = tmp_path / "h.sqlite"
    assert _run(capsys, "check", FULL, "--db", path, "--add")[0] == 1  # nothing compared: stored as refused
    assert _run(capsys, "check", FULL, "--db", path, "--add", "--allow-new")[0] == 0
    rows = sqlite3.connect(path).execute("SELECT batch, accepted FROM runs ORDER BY id").fetchall()
    assert rows == [(1, 1)]
    assert _run(capsys, "check", WS1G, "--db", path)[0] == 1  # now compared with it: +1.00 GiB


def test_a_new_oom_fails_the_check(tmp_path, capsys):
    # cap6g is its own key (a 6 GiB card); store cap6g's key with a run that did not die: the same trace
    # with its OOM dropped, then check the real one
    from memtrace.analysis.gate.history import record as rec

    path = tmp_path / "h.sqlite"
    assert _run(capsys, "add", CAP6, "--db", path)[0] == 0
    con = sqlite3.connect(path)
    doc = json.loads(con.execute("SELECT figures_device FROM runs").fetchone()[0])
    assert doc["oom"]["phase_path"] == "profile_run" and doc["oom"]["requested_bytes"] == GiB
    doc["oom"] = None
    con.execute("UPDATE runs SET figures_device = ?, figures_reserved = ?", (json.dumps(doc), json.dumps(doc)))
    con.commit()
    rc, out, _ = _run(capsys, "check", CAP6, "--db", path)
    assert rc == 1
    assert "the new run died of CUDA OOM in profile_run: requested 1024.00 MiB" in out
    assert rec(load_run(CAP6).traces[0]).reserved.oom.requested_bytes == GiB


def test_figures_survive_the_database_exactly():
    r = record(load_run(VLLM).traces[0])
    for f in (r.reserved, r.device):
        assert figures_from_doc(json.loads(json.dumps(figures_doc(f)))) == f
    assert r.rank == 0 and r.fingerprint["vllm"] == "0.25.1" and r.fingerprint["max_num_seqs"] == "8"


def test_recording_a_run_reads_the_categories_the_run_already_made(monkeypatch):
    """history keeps the phase peaks less the KV cache, whose tensors the analysed run already categorized: it reads
    them there (it categorized the trace again, once per level: twice more), with the same figures."""
    from memtrace.analysis.analysed.run import analyse
    from memtrace.analysis.gate.history import record_run
    from memtrace.analysis.memory import categories

    run = analyse(load_run(VLLM).traces)
    rank = run.ranks[0]
    expected = record(rank.trace, curves=rank.curves)  # categorizes the trace itself
    assert rank.categorized is not None
    monkeypatch.setattr(categories, "categorize", lambda *a, **k: pytest.fail("categorized again"))
    (got,) = record_run(run, "add")
    assert got.reserved.phases_less_kv and got.reserved == expected.reserved and got.device == expected.device


def test_show_lists_each_key_and_draws_the_trend(db, tmp_path, capsys, monkeypatch):
    _run(capsys, "check", WS1G, "--db", db, "--add")
    _run(capsys, "add", VLLM, "--db", db)
    monkeypatch.chdir(tmp_path)
    rc, out, _ = _run(capsys, "show", "--db", db)
    assert rc == 0
    png = tmp_path / "h-trend.png"
    assert f"wrote {png.name}" in out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = out.splitlines()
    assert lines[0].endswith("pytorch · NVIDIA H200 · torch 2.11.0+cu130 · record_startup.py")
    assert lines[2].split() == ["#1", "startup-full", "accepted", "130.65", "GiB", "131.40", "GiB", "5.40", "GiB",
                                "121.72", "GiB"]  # fmt: skip
    assert lines[3].split()[:3] == ["#2", "startup-ws1g", "refused"] and "6.40" in lines[3]
    assert "vllm 0.25.1 · flashinfer 0.6.13 · /tmp/model · rank 0" in out
    # issue 21: the second show failed on its own default figure; the default is the history's picture, redrawn
    rc, out, _ = _run(capsys, "show", "--db", db)
    assert rc == 0 and f"wrote {png.name}" in out
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"keep")
    rc, _, err = _run(capsys, "show", "--db", db, "-o", mine)
    assert rc == 2 and "exists; pass --force" in err and mine.read_bytes() == b"keep"  # a file asked for by name


def _hash(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_file_that_is_not_a_history_is_refused_unchanged(tmp_path, capsys):
    trace = next(FULL.glob("*.memtrace"))
    before = _hash(trace)
    rc, out, err = _run(capsys, "add", WS1G, "--db", trace)
    assert rc == 2 and err.count("\n") == 1 and "is not a memtrace history" in err and "Traceback" not in err
    assert _hash(trace) == before
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    rc, _, err = _run(capsys, "check", WS1G, "--db", text)
    assert rc == 2 and err.count("\n") == 1 and text.read_text() == "hello"


def test_a_newer_history_version_is_refused_by_name(db, capsys):
    con = sqlite3.connect(db)
    con.execute("UPDATE meta SET value = ? WHERE key = 'version'", (str(VERSION + 1),))
    con.commit()
    rc, _, err = _run(capsys, "check", WS1G, "--db", db)
    assert rc == 2 and f"version {VERSION + 1}; this memtrace reads up to {VERSION}" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["check", WS1G, "--db", "{tmp}/none.sqlite"], "no history at"),
        (["show", "--db", "{tmp}/none.sqlite", "--no-plot"], "no history at"),
        (["add", WS1G, "--db", "{tmp}/missing/h.sqlite"], "does not exist"),
        (["add", WS1G, "--db", "{tmp}"], "is a directory"),
        (["accept", "9", "--db", "{db}"], "holds no run #9"),
        (["check", WS1G, "--db", "{db}", "--fail-over", "lots"], "cannot read"),
        (["check", WS1G, "--db", "{db}", "--rank", "3"], "has no rank 3"),
    ],
)
def test_bad_input_is_one_line_exit_2(db, tmp_path, capsys, argv, message):
    argv = [str(a).replace("{tmp}", str(tmp_path)).replace("{db}", str(db)) for a in argv]
    before = _hash(db)
    rc, _, err = _run(capsys, *argv)
    assert rc == 2 and message in err and err.count("\n") == 1, err
    assert _hash(db) == before
    assert not (tmp_path / "none.sqlite").exists()


def test_the_example_ci_script_gates_recorded_runs_and_keeps_the_artifacts(tmp_path):
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "examples" / "ci" / "memtrace-gate.sh"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def gate(run: Path, **more: str) -> int:
        return subprocess.run(["bash", str(script)], cwd=tmp_path, env={**env, "RUN": str(run), **more},
                              capture_output=True, text=True, timeout=300).returncode  # fmt: skip

    assert gate(FULL) == 1  # the first run of its key: nothing compared, not passed
    assert "nothing compared, not passed" in (tmp_path / "memtrace-artifacts" / "history-check.txt").read_text()
    assert gate(FULL, ALLOW_NEW="1") == 0  # allowed: the same recording becomes the reference
    assert gate(WS1G) == 1  # +1.00 GiB before KV sizing
    art = tmp_path / "memtrace-artifacts"
    assert {p.name for p in art.iterdir()} >= {"report.txt", "report.md", "timeline.png", "flame.svg",
                                               "history-check.txt", "history.txt", "history-trend.png"}  # fmt: skip
    assert "FAIL: 3 figure(s) grew more than 2% (exit 1)" in (art / "history-check.txt").read_text()
    assert "startup-ws1g             refused" in (art / "history.txt").read_text()


@pytest.mark.parametrize(
    ("cmdline", "program"),
    [
        (["/opt/venv/bin/python3", "bench/record_startup.py", "--x"], "record_startup.py"),
        (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "vllm.entrypoints.openai.api_server"),
        # two scripts launched by torchrun are two programs (both were keyed "torchrun" before)
        (["/usr/bin/torchrun", "--nproc-per-node", "2", "train.py"], "train.py"),
        (["/usr/bin/torchrun", "--nproc-per-node", "2", "eval.py"], "eval.py"),
        (["my-launcher"], "my-launcher"),
        ([], ""),
    ],
)
def test_program_name_is_what_ran(cmdline, program):
    from memtrace.analysis.gate.history_key import program_name

    assert program_name({"cmdline": cmdline}) == program


def test_a_command_line_that_lost_a_flags_name_claims_nothing_was_left_to_vllm():
    """Traces recorded before memtrace stopped redacting every name holding "token" lost the flag after
    ``--skip-tokenizer-init``; a flag missing from such a line proves nothing, so none is "left to vLLM"
    (a diff would otherwise call the user's own setting a change the new versions made)."""
    from memtrace import facts as F
    from memtrace.analysis.gate.history_key import flags_readable, left_to_vllm
    from memtrace.model import Trace

    shipped = load_run(VLLM).traces[0]
    assert not flags_readable(shipped.facts["env"]["cmdline"])  # '--skip-tokenizer-init', '<redacted>', '127.0.0.1'

    def left(cmdline, util_source=None):
        t = Trace()
        t.facts[F.ENV] = {"cmdline": cmdline}
        if util_source:
            t.facts[F.UTIL_SOURCE] = util_source
        return left_to_vllm(t)

    lost = ["vllm", "serve", "m", "--skip-tokenizer-init", F.REDACTED, "32768", "--api-key", F.REDACTED]
    assert left(lost) == frozenset()
    assert left(lost, "vllm-default") == {"gpu_memory_utilization"}
    whole = ["vllm", "serve", "m", "--skip-tokenizer-init", "--max-model-len", "32768", "--api-key", F.REDACTED]
    assert flags_readable(whole)
    assert "max_model_len" not in left(whole) and "max_num_seqs" in left(whole)
