"""Frames are told apart by where torch and memtrace are installed, not by a folder's name (issue 34, item 3):
a user's code in a folder called ``memtrace``, ``tracer`` or ``torch`` is the user's."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import memtrace.capture.api
import memtrace.plots
from memtrace.analysis.holders.frames import meaningful_frame
from memtrace.model import Frame


def _pick(*files: str) -> str:
    f = meaningful_frame([Frame(fn, 10, f"f{i}") for i, fn in enumerate(files)])
    assert f is not None
    return f.filename


def test_a_users_code_in_folders_named_memtrace_tracer_or_torch_is_the_reason():
    torch_frame = "/venv/lib/python3.12/site-packages/torch/_ops.py"
    for user in ("/home/u/memtrace/tests/unit/test_x.py", "/srv/tracer/train.py", "/work/torch/app.py"):
        assert _pick(torch_frame, user) == user


def test_torch_and_memtrace_installed_anywhere_are_plumbing():
    user = "/home/u/job/train.py"
    recorded_elsewhere = [
        "/opt/torch/.venv/lib/python3.12/site-packages/torch/_dynamo/eval_frame.py",
        "/usr/lib/python3/dist-packages/torch/nn/modules/module.py",
        "/venv/lib/python3.12/site-packages/memtrace/capture/api.py",
    ]
    here = [memtrace.capture.api.__file__, str(Path(memtrace.plots.__file__).parent / "render.py")]
    spec = importlib.util.find_spec("torch")
    if spec is not None:
        here.append(str(Path(spec.origin).parent / "nn" / "modules" / "module.py"))
    for plumbing in recorded_elsewhere + here:
        assert _pick(plumbing, user) == user, plumbing


def test_classifying_frames_imports_no_torch():
    code = (
        "import sys; from memtrace.analysis.holders.frames import meaningful_frame; from memtrace.model import Frame; "
        "meaningful_frame([Frame('/x/site-packages/torch/a.py', 1, 'a'), Frame('/y/b.py', 2, 'b')]); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
