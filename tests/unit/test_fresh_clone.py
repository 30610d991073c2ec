"""A fresh clone in a folder named ``memtrace`` (the path that failed, issue 34): the README's main job and
quick start run there as written and leave its root as it was, and the path-dependent test passes there.

The clone holds this checkout's tracked files as they are now (``git stash create``: uncommitted changes
included, nothing in the checkout touched); the commands run with this interpreter's ``memtrace``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from testdata import DATA, unpacked

ROOT = Path(__file__).resolve().parents[2]
BIN = str(Path(sys.executable).parent)


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout")
    snapshot = _git("stash", "create") or _git("rev-parse", "HEAD")
    dest = tmp_path_factory.mktemp("clone") / "memtrace"
    _git("clone", "-q", "--shared", "--no-checkout", str(ROOT), str(dest))
    _git("checkout", "-q", "--detach", snapshot, cwd=dest)
    return dest


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}


def _block(text: str, after: str) -> str:
    m = re.search(re.escape(after) + r".*?```\n(.*?)\n```", text, re.S)
    assert m, f"the README lost its block after {after!r}"
    return m.group(1)


def _sh(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, shell=True, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{cmd}\n{done.stderr}"
    return done


def test_the_main_job_runs_as_written_in_a_clone_named_memtrace_and_leaves_its_root_alone(clone):
    steps = [s.strip() for s in _block((clone / "README.md").read_text(), "**Main job**").split("&&")]
    steps = [s for s in steps if not s.startswith(("python3 -m venv", ".venv/bin/pip"))]  # this venv stands for them
    assert any("memtrace flame tests/data/vllm-h200/startup-stacks" in s for s in steps)
    before = sorted(os.listdir(clone)), _git("status", "--porcelain", "--ignored", cwd=clone)
    for step in steps:
        _sh(step.replace(".venv/bin/", BIN + "/"), clone)
    # nothing written in the root nor beside the shipped trace (tests/data/vllm-h200/startup-stacks is xz-compressed)
    assert (sorted(os.listdir(clone)), _git("status", "--porcelain", "--ignored", cwd=clone)) == before
    svg = Path("/tmp/memtrace-demo/flame.svg").read_text(encoding="utf-8")
    assert "no stack recorded" not in svg and "_allocate_kv_cache_tensors" in svg  # a flame with stacks


def test_the_quick_starts_reading_lines_run_as_written_on_a_recorded_run(clone, tmp_path):
    lines = _block((clone / "README.md").read_text(), "## Quick start").splitlines()
    commands = [ln.split("#", 1)[0].strip() for ln in lines]
    assert commands[0] == "memtrace run -- vllm serve MODEL"  # needs a GPU and a model: its flags are parsed below
    # a recorded run as `memtrace run` leaves it: the plain SQLite bytes of the clone's (and this checkout's) xz trace
    shutil.copytree(unpacked(DATA / "vllm-h200" / "startup-stacks"), tmp_path / "memtrace-20261202-173538")
    report = _sh(commands[1], tmp_path).stdout
    assert "crossed it at 134.29 s in kv_cache_init" in report
    _sh(commands[2], tmp_path)
    assert sorted(os.listdir(tmp_path / "issue")) == ["flame.folded", "flame.svg", "issue.md", "timeline.png"]


def test_the_path_dependent_cupti_test_passes_in_a_clone_named_memtrace(clone):
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_cupti_source.py"],
        cwd=clone,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout[-3000:]
    assert "failed" not in done.stdout
