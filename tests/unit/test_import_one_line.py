"""``memtrace import``'s bad inputs are one line on stderr, nothing before it, and a trace is never
unpickled (issue 34, item 9)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from memtrace.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
TRACE = next((DATA / "h200" / "startup-cap6g").glob("*.memtrace"))
PACKED = next((DATA / "vllm-h200-034" / "moe-ext").glob("*.memtrace.xz"))


def _inputs(tmp: Path) -> dict[str, tuple[Path, str]]:
    good = TRACE.read_bytes()

    def put(name: str, data: bytes) -> Path:
        (tmp / name).write_bytes(data)
        return tmp / name

    return {
        "missing": (Path("/nonexistent.memtrace"), "/nonexistent.memtrace: no such file"),
        "directory": (tmp, "is a directory"),
        "empty": (put("empty.pickle", b""), "is empty"),
        "truncated trace": (put("cut.memtrace", good[: len(good) // 3]), "is corrupt or truncated"),
        "trace cut inside its header": (put("stub.memtrace", good[:10]), "corrupt or truncated memtrace trace"),
        "a trace": (TRACE, "is a memtrace trace already; read it directly: memtrace report"),
        "a compressed trace": (PACKED, "is a memtrace trace already"),
        "truncated archive": (put("cut.memtrace.xz", PACKED.read_bytes()[:4000]), "corrupt or truncated xz archive"),
        "not a snapshot": (put("plain.pickle", pickle.dumps({"hello": [1]}, protocol=4)), "snapshot"),
    }


@pytest.mark.parametrize(
    "kind",
    [
        "missing",
        "directory",
        "empty",
        "truncated trace",
        "trace cut inside its header",
        "a trace",
        "a compressed trace",
        "truncated archive",
        "not a snapshot",
    ],
)
def test_a_bad_import_input_is_exactly_one_error_line(kind, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path, words = _inputs(tmp_path)[kind]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["import", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("memtrace: error: "), err  # no pickle warning before it
    assert words in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before
