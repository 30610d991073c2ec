"""Every error a user can cause, for every command that reads a run (issue 10): one line on stderr, exit
code 2, no traceback, and every input byte for byte as it was (hashed before and after).

Inputs: missing, empty, truncated, corrupt, a foreign SQLite file, a trace from a future format version,
an unreadable file (a link to /proc/self/clear_refs: it exists, but reading it fails even for root), an
unlistable run folder's stand-in (a file where a folder is expected), a non-snapshot pickle. Outputs: an
unwritable place, a folder that does not exist, the input itself (with --force), a path inside a trace
file, a suffix the format cannot write.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import sqlite3
from pathlib import Path

import pytest
from memtrace.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
REAL = DATA / "h200" / "startup-cap6g"

#: command -> the argv after the input path (each command gets its own output name under OUT)
READERS = {
    "report": [],
    "plot": ["-o", "{out}/t.png"],
    "flame": ["-o", "{out}/f.svg"],
    "fits": ["--capacity", "16GiB"],
    "issue": ["-o", "{out}/bundle"],
    "export": ["-o", "{out}/p.perfetto.json"],
    "view": ["-o", "{out}/v.html"],
    "diff": ["{real}"],  # the bad input as BASE, a real run as NEW
}


def _sha(path: Path) -> str:
    if path.is_symlink() or not path.exists():
        return "-"
    if path.is_dir():
        return ",".join(f"{p.name}:{_sha(p)}" for p in sorted(path.iterdir()))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _bad_inputs(tmp: Path) -> dict[str, tuple[Path, str]]:
    """name -> (path, a word the message must hold)."""
    trace = next(REAL.glob("*.memtrace"))
    good = trace.read_bytes()
    out: dict[str, tuple[Path, str]] = {}

    def put(name: str, data: bytes, word: str, suffix: str = ".memtrace") -> None:
        p = tmp / f"{name}{suffix}"
        p.write_bytes(data)
        out[name] = (p, word)

    out["missing"] = (tmp / "nowhere.memtrace", "no such file")
    put("empty", b"", "empty")
    put("truncated", good[: len(good) // 3], "corrupt")
    put("not-sqlite", b"hello, this is not a trace" * 10, "not a memtrace trace")
    foreign = tmp / "foreign.memtrace"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE t(x)")
    con.commit()
    con.close()
    out["foreign"] = (foreign, "not a memtrace trace")
    future = tmp / "future.memtrace"
    shutil.copy(trace, future)
    con = sqlite3.connect(future)
    con.execute("UPDATE meta SET value = '9.0' WHERE key = 'version'")
    con.commit()
    con.close()
    out["future"] = (future, "upgrade memtrace (pip install -U memtrace-vllm)")
    unreadable = tmp / "unreadable.memtrace"
    unreadable.symlink_to("/proc/self/clear_refs")
    out["unreadable"] = (unreadable, "cannot read")
    put("not-a-snapshot", pickle.dumps({"hello": [1, 2, 3]}, protocol=4), "snapshot", ".pickle")
    empty_dir = tmp / "empty-run"
    empty_dir.mkdir()
    out["empty-run"] = (empty_dir, "holds no .memtrace files")
    return out


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    return _bad_inputs(tmp_path_factory.mktemp("bad-inputs"))


def _fails_cleanly(capsys, argv: list[str], watched: list[Path], word: str = "") -> str:
    before = [_sha(p) for p in watched]
    code = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if not ln.startswith("memtrace: warning:")]
    assert code == 2, (argv, err)
    assert len(lines) == 1 and lines[0].startswith("memtrace: error: "), (argv, err)
    assert "Traceback" not in err
    assert word in lines[0], (argv, lines[0])
    assert [_sha(p) for p in watched] == before
    return lines[0]


@pytest.mark.parametrize("command", sorted(READERS))
@pytest.mark.parametrize(
    "kind",
    ["missing", "empty", "truncated", "not-sqlite", "foreign", "future", "unreadable", "not-a-snapshot", "empty-run"],
)
def test_a_bad_input_is_one_line_and_exit_2_for_every_command(command, kind, bad, tmp_path, capsys):
    path, word = bad[kind]
    args = [a.format(out=tmp_path, real=REAL) for a in READERS[command]]
    _fails_cleanly(capsys, [command, str(path), *args], [path, REAL], word)
    assert not any(tmp_path.iterdir()), "a failed command left files behind"


@pytest.mark.parametrize(
    ("command", "make_out", "word"),
    [
        ("plot", lambda run, tmp: "/sys/t.png", "cannot write"),
        ("plot", lambda run, tmp: str(tmp / "deep" / "er" / "t.png"), "does not exist"),
        ("plot", lambda run, tmp: str(next(run.glob("*.memtrace"))), "input"),
        ("plot", lambda run, tmp: str(next(run.glob("*.memtrace")) / "t.png"), "input"),
        ("plot", lambda run, tmp: str(tmp / "t.txt"), ".png"),
        ("flame", lambda run, tmp: str(tmp / "f.png"), ".svg"),
        ("flame", lambda run, tmp: str(next(run.glob("*.memtrace"))), "input"),
        ("flame", lambda run, tmp: (tmp / "d").mkdir() or str(tmp / "d"), "directory"),
        ("flame", lambda run, tmp: str(tmp), "holds the input"),
        ("export", lambda run, tmp: str(next(run.glob("*.memtrace"))), "input"),
        ("export", lambda run, tmp: "/sys/p.perfetto.json", "cannot write"),
        ("view", lambda run, tmp: str(tmp / "v.png"), ".html"),
        ("issue", lambda run, tmp: str(next(run.glob("*.memtrace"))), "input"),
    ],
)
def test_a_bad_output_is_one_line_and_exit_2_and_the_run_is_untouched(command, make_out, word, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(REAL, run)
    out = make_out(run, tmp_path)
    _fails_cleanly(capsys, [command, str(run), "-o", out, "--force"], [run], word)
    assert not (tmp_path / "deep").exists()  # no folder is created silently


def test_import_never_writes_over_its_snapshot_even_with_force(tmp_path, capsys):
    snap = tmp_path / "s.pickle"
    shutil.copy(DATA / "snapshots" / "python-stacks.pickle", snap)
    _fails_cleanly(capsys, ["import", str(snap), "-o", str(snap), "--force"], [snap], "input")


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "{run}", "--target", "0"],
        ["report", "{run}", "--target", "-5GiB"],
        ["report", "{run}", "--util", "0"],
        ["report", "{run}", "--util", "1.5"],
        ["report", "{run}", "--top", "-3"],
        ["report", "{run}", "--json", "--markdown"],
        ["report", "{run}", "--rank", "9"],
        ["report", "{run}", "--total", "80GB"],
        ["plot", "{run}", "--rank", "-1"],
        ["fits", "{run}", "--capacity", "0"],
        ["fits", "{run}", "--capacity", "1MiB"],
        ["flame", "{run}", "--at", "99999s"],
        ["flame", "{run}", "--at", "no_such_phase"],
        ["diff", "{run}", "{run}", "--fail-over", "-2%"],
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fails_cleanly(capsys, [a.format(run=REAL) for a in argv], [REAL])
    assert not os.listdir(tmp_path)


# Issue 41: the inputs a new user found answered in two lines, with a traceback, or not refused at all.


def _one_line_exit_2(capsys, argv: list[str], watched: list[Path], word: str) -> str:
    """As :func:`_fails_cleanly`, but no other line either (no warning first) and argparse's own errors too."""
    before = [_sha(p) for p in watched]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse exits from parse_args
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    assert err.count("\n") == 1 and err.startswith("memtrace: error: "), (argv, err)
    assert word in err, (argv, err)
    assert [_sha(p) for p in watched] == before
    return err


@pytest.mark.parametrize(
    ("out", "word"),
    [
        ("/proc/x.memtrace", "cannot write /proc/x.memtrace: folder /proc is not writable"),
        ("/sys/x.memtrace", "cannot write /sys/x.memtrace: folder /sys is not writable"),
        ("/proc/run", "cannot write /proc/run: folder /proc is not writable"),  # a folder for several devices
        ("{snap}", "is the input"),  # before unpickling, so no pickle warning comes first
    ],
)
def test_import_refuses_an_unusable_output_in_one_line_before_reading(out, word, tmp_path, capsys):
    snap = tmp_path / "snap.pickle"
    shutil.copy(DATA / "snapshots" / "python-stacks.pickle", snap)
    _one_line_exit_2(capsys, ["import", str(snap), "-o", out.format(snap=snap)], [snap], word)
    assert [p.name for p in tmp_path.iterdir()] == ["snap.pickle"]


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["fits", "{run}", "--capacity", "24GiB,,32GiB"], "'24GiB,,32GiB': an empty size in the list"),
        (["fits", "{run}", "--capacity", "16GiB,"], "an empty size in the list"),
        (["plot", "{run}", "--capacity", ",16GiB"], "an empty size in the list"),
        (["fits", "{run}", "--capacity", "-5GiB"], "give at least 1GiB, a card's memory"),
        (["view", "{run}", "--max-events", "0"], "--max-events 0: give how many events a page may carry, 1 or more"),
        (["diff", "{run}", "{run}", "--fail-over", "200x"], "cannot read limit '200x': write a percentage (2%)"),
        (["history", "accept", "abc"], "history accept: argument N: invalid int value: 'abc'"),
        (["flame", "{run}", "--added", "--since", "5"], "flame: argument --since: not allowed with argument --added"),
        (["report", "{run}", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["export", "{empty}", "-f", "folded"], "recorded no allocator events, so there is nothing to show"),
        (
            ["report", "{tp2}"],
            "holds no .memtrace files itself but 3 runs in subfolders (memtrace-env, memtrace-run, ray-two-nodes)",
        ),
    ],
    ids=lambda a: " ".join(a[:1] + a[2:]) if isinstance(a, list) else None,
)
def test_issue_41_inputs_are_refused_in_one_line_with_exit_2(argv, word, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = {"run": REAL, "empty": DATA / "vllm-cpu-tp2" / "memtrace-run", "tp2": DATA / "vllm-cpu-tp2"}
    argv = [a.format(**paths) for a in argv]
    _one_line_exit_2(capsys, argv, [REAL, paths["empty"]], word)
    assert not os.listdir(tmp_path)  # export -f folded wrote no 0-byte file
