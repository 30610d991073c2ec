"""Each text renderer's whole output on shipped traces, at a fixed width, against its golden file (issue 41; as
rich and memray test theirs): a rewording, a moved column or two sections that disagree is one reviewed diff.

The golden files are ``tests/unit/golden/<case>.txt``. After a deliberate change, write them again with
``MEMTRACE_GOLDEN_UPDATE=1 .venv/bin/python -m pytest -q tests/unit/test_golden_text.py`` and review the diff.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
from memtrace.cli import main

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
CAP6G = "tests/data/h200/startup-cap6g"  # a vLLM-shaped start-up that died of OOM in profile_run
MOE = "tests/data/vllm-h200-034/moe-ext"  # vLLM 0.34, extensible KV cache, booted
STACKS = "tests/data/vllm-h200/startup-stacks"  # vLLM 0.25.1 with Python stacks, booted over its target

#: case -> (argv, output file the command writes, else None: its stdout)
CASES = {
    "report-cap6g": (["report", CAP6G, "--width", "100"], None),
    "report-moe-ext": (["report", MOE, "--width", "100"], None),
    "report-serving-oom": (["report", "tests/data/vllm-h200-034-serving/oom", "--width", "100"], None),
    "report-cpu-profiler-tp2": (["report", "tests/data/vllm-cpu-profiler/tp2", "--width", "100"], None),
    "report-markdown-cap6g": (["report", CAP6G, "--markdown"], None),
    "diff-seed-b12x": (["diff", "tests/data/h200/seed-b12x-0613", "tests/data/h200/seed-b12x-074", "--fail-over", "2%"], None),
    "fits-stacks": (["fits", STACKS, "--capacity", "80GiB,96GiB"], None),
    "fits-whatif-g08": (["fits", "tests/data/vllm-h200-034-grid/g08", "--capacity", "16GiB,32GiB", "--what-if", "max-num-seqs=4"], None),
    "issue-cap6g": (["issue", CAP6G, "-o", "{out}/bundle"], "bundle/issue.md"),
    "folded-cap6g": (["export", CAP6G, "-f", "folded", "-o", "{out}/f.folded"], "f.folded"),
}  # fmt: skip


def _output(case: str, tmp_path: Path, capsys) -> str:
    argv, written = CASES[case]
    code = main([a.format(out=tmp_path) for a in argv])
    out = capsys.readouterr().out
    assert code in (0, 1), out
    return (tmp_path / written).read_text(encoding="utf-8") if written else out


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_renderer_prints_its_golden_text(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the paths the outputs name are the repository's relative ones
    got = _output(case, tmp_path, capsys)
    golden = GOLDEN / f"{case}.txt"
    if os.environ.get("MEMTRACE_GOLDEN_UPDATE") == "1":
        golden.write_text(got, encoding="utf-8")
    want = golden.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "golden", "today"))
    assert got == want, f"{case} changed (MEMTRACE_GOLDEN_UPDATE=1 writes it again):\n{diff[:6000]}"
