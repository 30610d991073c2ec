"""Compressed traces (``.memtrace.xz``/``.gz``, and folders of them) open wherever a ``.memtrace`` does (issue 34).

The shipped vLLM 0.33/0.34 traces are xz files; users compress traces to attach them to issues.
"""

from __future__ import annotations

import gzip
import lzma
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from memtrace.cli import main
from memtrace.store import load_run, load_trace
from testdata import PACKED, real_traces, unpacked

DATA = Path(__file__).resolve().parents[1] / "data"
MOE_EXT = DATA / "vllm-h200-034" / "moe-ext"
PLAIN = unpacked(DATA / "vllm-h200" / "startup-stacks")  # shipped xz-compressed too: its plain SQLite copy


def _leftovers() -> set[str]:
    return {n for n in Path(tempfile.gettempdir()).iterdir() if n.name.startswith(".") and n.suffix == ".memtrace"}


def test_the_start_ups_shipped_plain_before_are_read_as_writable_plain_copies_outside_the_repository():
    listed = set(real_traces())
    for folder in PACKED:
        shipped = DATA / folder
        packed = sorted(p.name for p in shipped.glob("*.memtrace.xz"))
        assert packed and not list(shipped.glob("*.memtrace")), folder  # only the xz is in the repository
        run = unpacked(shipped)
        assert not run.resolve().is_relative_to(DATA) and unpacked(shipped) == run  # unpacked once, elsewhere
        plain = sorted(run.glob("*.memtrace"))
        assert [p.name + ".xz" for p in plain] == packed and set(plain) <= listed
        for p in plain:
            assert p.read_bytes()[:16] == b"SQLite format 3\x00" and os.access(p, os.W_OK)


def test_the_shipped_034_folder_of_xz_traces_reports_directly(capsys):
    assert main(["report", str(MOE_EXT)]) == 0
    out = capsys.readouterr().out
    assert "vllm 0.34.0" in out and "vm-pid2005-rank0.memtrace.xz" in out


def test_an_xz_trace_loads_the_same_events_as_its_plain_copy_and_leaves_no_temporary_file(tmp_path):
    before = _leftovers()
    packed = next(MOE_EXT.glob("*.memtrace.xz"))
    plain = tmp_path / packed.name[: -len(".xz")]
    plain.write_bytes(lzma.decompress(packed.read_bytes()))
    a, b = load_trace(packed), load_trace(plain)
    assert len(a.events) == 13_587 and np.array_equal(a.events, b.events) and a.phases == b.phases
    assert a.path == str(packed)  # the user's file is named, not the temporary copy
    assert _leftovers() == before


def test_a_gz_trace_and_a_folder_of_one_load_like_the_plain_trace(tmp_path):
    plain = next(PLAIN.glob("*.memtrace"))
    run = tmp_path / "run"
    run.mkdir()
    gz = run / (plain.name + ".gz")
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    want = load_trace(plain)
    for got in (load_trace(gz), *load_run(run).traces):
        assert np.array_equal(got.events, want.events) and got.facts == want.facts


def test_a_compressed_copy_beside_its_plain_trace_is_one_trace_not_two_runs(tmp_path):
    plain = next(PLAIN.glob("*.memtrace"))
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(plain, run / plain.name)
    (run / (plain.name + ".xz")).write_bytes(lzma.compress(plain.read_bytes(), preset=0))
    traces = load_run(run).traces
    assert [Path(t.path).name for t in traces] == [plain.name]


@pytest.mark.parametrize("kind", ["xz", "gz"])
def test_a_truncated_archive_is_one_line_and_exit_2(kind, tmp_path, capsys):
    plain = next(PLAIN.glob("*.memtrace")).read_bytes()
    data = lzma.compress(plain, preset=0) if kind == "xz" else gzip.compress(plain, compresslevel=1)
    bad = tmp_path / f"t.memtrace.{kind}"
    bad.write_bytes(data[: len(data) // 2])
    before = _leftovers()
    assert main(["report", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"memtrace: error: {bad} is a corrupt or truncated {kind} archive (")
    assert _leftovers() == before


def test_diff_compares_two_compressed_runs_and_plot_names_its_output_after_the_trace(tmp_path, capsys, monkeypatch):
    noext = DATA / "vllm-h200-034" / "moe-noext"
    main(["diff", str(noext), str(MOE_EXT)])
    out = capsys.readouterr().out
    assert "allocated through PyTorch's allocator → CUDA's VMM API (117.18 GiB → 126.23 GiB)" in out
    monkeypatch.chdir(tmp_path)
    packed = next(MOE_EXT.glob("*.memtrace.xz"))
    assert main(["plot", str(packed)]) == 0
    assert (tmp_path / "vm-pid2005-rank0-timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_an_output_may_not_replace_a_compressed_trace_of_the_input_run(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(MOE_EXT, run)
    target = next(run.glob("*.memtrace.xz"))
    assert main(["export", str(run), "-f", "folded", "-o", str(target), "--force"]) == 2
    assert "input" in capsys.readouterr().err
