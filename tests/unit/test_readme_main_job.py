"""The README's main job runs as written and leaves nothing in the repo root (issue 10, defect 18)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _main_job_steps() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"\*\*Main job\*\*.*?```\n(.*?)\n```", text, re.S)
    assert block, "the README lost its main-job command"
    steps = [s.strip() for s in block.group(1).split("&&")]
    # the set-up steps (a fresh venv, pip) are what .ci/setup already did for this test run
    return [s for s in steps if not s.startswith(("python3 -m venv", ".venv/bin/pip"))]


def test_main_job_runs_and_writes_nothing_in_the_repo_root(tmp_path):
    steps = _main_job_steps()
    assert any("memtrace plot" in s for s in steps) and any("memtrace flame" in s for s in steps)
    before = set(os.listdir(ROOT))
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    for step in steps:
        cmd = step.replace(".venv/bin/", bindir + "/")
        done = subprocess.run(cmd, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{step}\n{done.stderr}"
    assert set(os.listdir(ROOT)) == before
    assert Path("/tmp/memtrace-demo/timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert "<svg" in Path("/tmp/memtrace-demo/flame.svg").read_text(encoding="utf-8")[:2000]
