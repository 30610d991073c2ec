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


# -- where the recording process had its libraries (issue 41, item 2) ----------------------------------------
DATA = Path(__file__).resolve().parents[1] / "data"


def _trace(filenames, facts=None):
    from memtrace.model import Trace

    return Trace(frames=[Frame(fn, 10, f"f{i}") for i, fn in enumerate(filenames)], facts=facts or {})


def test_recorded_install_paths_make_any_file_in_torchs_folder_torchs():
    from memtrace import facts as F
    from memtrace.analysis.holders.frames import DIRS_RECORDED, library_dirs

    files = ["/opt/x/torch/not_a_file_of_any_torch.py", "/opt/x/app/model.py"]
    t = _trace(files, {F.INSTALL_PATHS: {"torch": "/opt/x/torch", "vllm": "/opt/x/vllm"}})
    dirs = library_dirs(t)
    assert dirs.source == DIRS_RECORDED
    assert dirs.library(files[0]) == "torch" and dirs.library(files[1]) is None
    assert meaningful_frame(t.frames, dirs).filename == "/opt/x/app/model.py"
    assert meaningful_frame(t.frames, library_dirs(_trace(files))).filename == files[0]  # not recorded: not torch's


def test_torch_outside_site_packages_is_inferred_from_files_of_torchs_own_layout():
    from memtrace.analysis.holders.frames import DIRS_INFERRED, NO_DIRS, infer_library_dirs

    if importlib.util.find_spec("torch") is None:
        return
    dirs = infer_library_dirs(["/tmp/site034/torch/utils/_device.py", "/work/torch/app.py", "/srv/torch/x/y.py"])
    assert dirs.source == DIRS_INFERRED and dirs.dirs == {"torch": ("/tmp/site034/torch/",)}
    assert infer_library_dirs(["/work/torch/app.py", "/srv/torch/nothing/here.py"]) is NO_DIRS
    # without the trace's folders a frame is judged by itself: a file of torch's layout is torch's
    assert (
        _pick("/tmp/site034/torch/utils/_device.py", "/tmp/site034/vllm/worker/x.py") == "/tmp/site034/vllm/worker/x.py"
    )


def test_vllm_034_traces_top_holders_name_vllms_frames_not_torchs():
    from memtrace.analysis.holders.frames import library_dirs
    from memtrace.store import load_run

    from tests.testdata import analysed_rank, unpacked_dir

    for name in ("moe-ext", "moe-noext", "dense-ext", "dense-noext", "small-ext"):
        (t,) = load_run(unpacked_dir(f"vllm-h200-034/{name}")).traces
        assert library_dirs(t).dirs["torch"] == ("/tmp/site034/torch/",), name
        lines = analysed_rank(t).holders
        named = [h.frame.filename for h in lines if h.frame is not None]
        assert named and not any("/torch/" in fn for fn in named), (name, named)
        assert named[0].startswith("/tmp/site034/vllm/"), (name, named[0])


def test_capture_records_the_folders_of_libraries_already_imported_and_imports_none():
    code = (
        "import sys; from memtrace.capture import env; before = set(sys.modules); p = env.install_paths(); "
        "assert set(sys.modules) == before; import json; print(json.dumps(p))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "{}"  # neither torch nor vLLM imported: nothing said, nothing imported
    if importlib.util.find_spec("torch") is None:
        return
    code = "import torch; from memtrace.capture import env; print(env.install_paths()['torch'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(Path(importlib.util.find_spec("torch").origin).parent)


def test_a_stack_without_python_frames_names_its_autograd_node_short():
    """mryab/efficient-dl-systems' snapshot (stacks="all"): the backward allocations of the autograd thread."""
    from memtrace.importers.files import traces_from_snapshot_file

    from tests.testdata import analysed_rank

    (t,) = traces_from_snapshot_file(DATA / "snapshots" / "autograd-cpp-frames.pickle")
    from memtrace.plots.frame_words import frame_text

    texts = [frame_text(h.frame) for h in analysed_rank(t).holders]
    assert "NllLossBackward0::apply (C++; no Python frame)" in texts
    assert "LogSoftmaxBackward0::apply (C++; no Python frame)" in texts
    assert sum(".py:" in x for x in texts) == 4


def test_a_recorded_trace_states_where_its_process_imported_torch_and_the_analysis_uses_it(tmp_path):
    """A real recording (no GPU here: facts and phases only), torch imported by the recorded process."""
    code = f"import sys, torch, memtrace\nwith memtrace.trace({str(tmp_path)!r}) as s:\n    pass\nprint(s.path)\n"
    path = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()[-1]
    from memtrace import facts as F
    from memtrace.analysis.holders.frames import DIRS_RECORDED, library_dirs
    from memtrace.store import load_trace

    t = load_trace(path)
    torch_dir = str(Path(importlib.util.find_spec("torch").origin).parent)
    assert t.facts[F.INSTALL_PATHS] == {"torch": torch_dir}
    dirs = library_dirs(t)
    assert dirs.source == DIRS_RECORDED and dirs.library(torch_dir + "/nn/modules/module.py") == "torch"


def test_without_the_traces_folders_a_stacks_own_torch_frames_show_torchs_folder():
    if importlib.util.find_spec("torch") is None:
        return
    stack = ["/s/torch/_tensor.py", "/s/torch/nn/modules/module.py", "/s/vllm/worker/x.py"]
    assert _pick(*stack) == "/s/vllm/worker/x.py"  # _tensor.py: torch's, as module.py shows /s/torch/ is torch
    assert _pick("/work/torch/_tensor.py", "/work/app.py") == "/work/torch/_tensor.py"  # nothing shows it is torch


def _recorded_trace():
    """One allocation whose innermost frame is in the folder the recording process had torch in (a file this
    torch lacks: only the recorded folder says it is torch's), called from the user's model."""
    from memtrace import facts as F
    from memtrace.model import ACTION_CODE, Trace, empty_events

    files = ["/opt/x/torch/not_a_file_of_any_torch.py", "/opt/x/app/model.py"]
    ev = empty_events(2)
    ev["time_us"], ev["addr"], ev["size"], ev["stack"] = [10, 10], [1 << 20, 1 << 20], [2 << 20, 512], [-1, 0]
    ev["action"] = [ACTION_CODE["segment_alloc"], ACTION_CODE["alloc"]]
    frames = [Frame(fn, 10, f"f{i}") for i, fn in enumerate(files)]
    return Trace(frames=frames, stacks=[(0, 1)], events=ev, facts={F.INSTALL_PATHS: {"torch": "/opt/x/torch"}})


def test_every_output_names_a_stack_by_the_traces_recorded_library_folders():
    """The viewer's titles, the report's holders and the budget's lines read one owner (frames.library_dirs),
    not each a guess from the stack's own frames."""
    from memtrace.analysis.holders.frames import site_frame
    from memtrace.plots.view_data import rank_meta

    from tests.testdata import analysed_rank

    t = _recorded_trace()
    assert site_frame(t, 0).filename == "/opt/x/app/model.py" and site_frame(t, -1) is None
    rank = analysed_rank(t)
    meta = rank_meta(rank, 0)
    assert [h.frame.filename for h in rank.holders] == ["/opt/x/app/model.py"]
    assert meta["stack_titles"][0].startswith("f1 ") and "model.py" in meta["stack_titles"][0]
    assert all("not_a_file" not in title for title in meta["path_titles"])


def test_the_folder_cache_forgets_a_freed_trace_and_keeps_a_bounded_number():
    import gc

    from memtrace.analysis.holders import frames

    t = _recorded_trace()
    frames.library_dirs(t)
    key = id(t)
    assert key in frames.library_dirs.memo
    del t
    gc.collect()
    assert key not in frames.library_dirs.memo  # its id may be another trace's now: nothing of it is left to be found
    alive = [_recorded_trace() for _ in range(frames.MEMO_MAX * 2)]
    for t in alive:
        assert frames.library_dirs(t).dirs == {"torch": ("/opt/x/torch/",)}
    assert len(frames.library_dirs.memo) == frames.MEMO_MAX


def test_a_diff_names_a_changed_site_by_its_runs_recorded_library_folders(tmp_path, capsys):
    from memtrace.cli import main
    from memtrace.store import save_trace

    base, new = _recorded_trace(), _recorded_trace()
    new.events["size"][1] = 1 << 20  # the same site holds more in the new run
    save_trace(base, tmp_path / "a.memtrace")
    save_trace(new, tmp_path / "b.memtrace")
    main(["diff", str(tmp_path / "a.memtrace"), str(tmp_path / "b.memtrace")])
    out = capsys.readouterr().out
    assert "f1 (app/model.py:10)" in out and "not_a_file_of_any_torch" not in out
