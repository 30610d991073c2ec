"""`memtrace flame` on the real H200 traces: --at oom and every time unit, what a phase added
(--added / --since), labels that read without hovering, and the output policy (defects 4, 9, 11, 14).

Real data: tests/data/h200/startup-cap16g (died of OOM in kernel_warmup at 7.052 s on a 16 GiB card)
and tests/data/vllm-h200/startup (vLLM 0.25.1, no Python stacks).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from memtrace import facts as F
from memtrace.analysis.holders.flame import flame_at
from memtrace.analysis.holders.live import lifetimes
from memtrace.analysis.holders.moment import parse_time_us, resolve_moment, with_since
from memtrace.analysis.memory.curves import all_curves
from memtrace.cli import main
from memtrace.errors import UsageError
from memtrace.plots.flame_svg import fit_label, short_label
from memtrace.plots.folded import folded_lines
from memtrace.store import load_run
from testdata import unpacked

DATA = Path(__file__).resolve().parents[1] / "data"
CAP16, VLLM = DATA / "h200" / "startup-cap16g", unpacked(DATA / "vllm-h200" / "startup")


@pytest.fixture(scope="module")
def cap16():
    trace = load_run(CAP16).traces[0]
    return trace, all_curves(trace)


@pytest.mark.parametrize(("text", "us"), [("7.05", 7_050_000), ("7.05s", 7_050_000), ("7050ms", 7_050_000),
                                          ("7050000us", 7_050_000), ("7050000µs", 7_050_000), ("2.5e-3s", 2_500)])  # fmt: skip
def test_times_read_seconds_milliseconds_and_microseconds(text, us):
    assert parse_time_us(text) == us


@pytest.mark.parametrize("text", ["profile_run", "7.05 h", "-1s", "nan", ""])
def test_what_is_not_a_time_is_not_read_as_one(text):
    assert parse_time_us(text) is None


def test_at_7050ms_is_the_same_moment_as_7_05s(cap16):
    trace, curves = cap16
    assert resolve_moment(trace, curves, "7050ms") == resolve_moment(trace, curves, "7.05s")


def test_at_oom_is_the_recorded_oom_in_the_phase_it_died_in(cap16):
    trace, curves = cap16
    m = resolve_moment(trace, curves, "oom")
    assert m.time_us == trace.facts[F.OOM]["time_us"]
    assert m.phase_path == "compile_or_warm_up/kernel_warmup"
    flame = flame_at(trace, m.time_us)
    # what torch held when the 1 GiB request failed: "14.32 GiB is allocated by PyTorch" (outcomes.json)
    assert f"{flame.total_bytes / 1024**3:.2f}" == "14.32"


def test_at_oom_on_a_run_that_did_not_die_is_one_line(tmp_path, capsys):
    assert main(["flame", str(DATA / "h200" / "startup-full"), "--at", "oom", "-o", str(tmp_path / "f.svg")]) == 2
    err = capsys.readouterr().err.strip()
    assert "recorded no out-of-memory error" in err and err.count("\n") == 0


def test_added_keeps_exactly_what_the_phase_allocated_and_still_held(cap16):
    trace, curves = cap16
    m = with_since(trace, curves, resolve_moment(trace, curves, "profile_run"), None, True)
    assert m.since_what == "the start of profile_run"
    flame = flame_at(trace, event_index=m.event_index, since_us=m.since_us)
    lt = lifetimes(trace)  # independent count: allocation positions around the moment
    k = m.event_index
    live = (lt.alloc_pos <= k) & (lt.free_pos > k) & (lt.alloc_us >= m.since_us) & (lt.alloc_pos >= 0)
    assert flame.total_bytes == int(lt.size[live].sum()) > 0
    assert flame.total_bytes < curves.allocated.bytes[k + 1]  # the weights, made before, are left out
    assert not any("create_weights" in ";".join(p) for p in flame.stacks)
    assert sum(int(line.rsplit(" ", 1)[1]) for line in folded_lines(flame)) == flame.total_bytes


def test_since_a_time_equals_since_the_phase_that_starts_then(cap16):
    trace, curves = cap16
    at = resolve_moment(trace, curves, "profile_run")
    by_phase = with_since(trace, curves, at, "profile_run", False)
    start = trace.recording.start_us or int(trace.events["time_us"][0])
    seconds = f"{(by_phase.since_us - min(start, int(np.min(trace.events['time_us'])))) / 1e6:.6f}s"
    assert with_since(trace, curves, at, seconds, False).since_us in (by_phase.since_us, by_phase.since_us - 1)


def test_since_after_the_moment_and_both_flags_are_refused(cap16):
    trace, curves = cap16
    at = resolve_moment(trace, curves, "load_model")
    with pytest.raises(UsageError, match="comes after"):
        with_since(trace, curves, at, "kv_cache_init", False)
    with pytest.raises(UsageError, match="either --added or --since"):
        with_since(trace, curves, at, "load_model", True)


def test_flame_cli_added_on_the_real_vllm_run_groups_by_phase(tmp_path, capsys):
    out = tmp_path / "p.folded"
    assert main(["flame", str(VLLM), "--at", "profile_run", "--added", "-o", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines and all(
        line.startswith("[no stack recorded];[phase] determine_available_memory/profile_run") for line in lines
    )
    assert "added since the start of determine_available_memory/profile_run" in capsys.readouterr().err


def test_sibling_frames_of_one_function_show_their_lines_without_hovering(cap16, tmp_path):
    """Defect 14: five sibling `startup` boxes read "startup", "startup", ...; each now says its line."""
    out = tmp_path / "f.svg"
    assert main(["flame", str(CAP16), "-o", str(out)]) == 0
    texts = re.findall(r"<text [^>]*>([^<]*)</text>", out.read_text())
    frame = re.compile(r"^st(?:artup|[a-z]*…)(?: \(examples/record_startup\.py)?:(\d+)")
    lines = [m.group(1) for t in texts if (m := frame.match(t))]
    assert len(lines) >= 4 and len(set(lines)) == len(lines)  # every box says its line; no two the same
    assert any(t == "startup:249 · 3.49 GiB" for t in texts)


def test_box_labels_keep_bytes_and_the_line_as_they_shrink():
    label = "startup (examples/record_startup.py:290)"
    assert short_label(label) == "startup:290"
    assert fit_label(label, 1610612736, 1000) == f"{label} · 1.50 GiB"
    assert fit_label(label, 1610612736, 160) == "startup:290 · 1.50 GiB"
    assert fit_label(label, 1610612736, 100) == "startup:290"
    assert fit_label(label, 1610612736, 60) == "st…:290"
    assert fit_label(label, 1610612736, 20) == ""
    assert short_label("[hook] allocate_sm120_dynamic_workspace") == "allocate_sm120_dynamic_workspace"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-o", "f.png"], "this format writes .svg files"),
        (["-f", "folded", "-o", "f.svg"], "this format writes .folded or .txt files"),
        (["-o", "/missing/deep/x.svg"], "folder /missing/deep does not exist"),
        (["--at", "7050 parsecs"], "no such phase or time"),
        (["--at", "99s"], "the run lasts 7.094 s"),
        (["--added", "--since", "1s"], "not allowed with argument"),
    ],
)
def test_flame_refusals_are_one_line_exit_2(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) if "not allowed" in message else _nothing():
        assert main(["flame", str(CAP16), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    if "not allowed" not in message:
        assert err.count("\n") == 0
    assert not (tmp_path / "f.png").exists() and not Path("/missing").exists()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_flame_never_writes_over_its_input_even_with_force(tmp_path, capsys):
    """Defect 9: `flame in.memtrace -o in.memtrace --force` destroyed the trace."""
    run = tmp_path / "cap16"
    shutil.copytree(CAP16, run)
    trace = run / "vm-pid552.memtrace"
    before = trace.read_bytes()
    assert main(["flame", str(trace), "-o", str(trace), "--force"]) == 2
    assert main(["flame", str(trace), "-f", "folded", "-o", str(trace), "--force"]) == 2
    assert main(["flame", str(run), "-o", str(run), "--force"]) == 2
    assert trace.read_bytes() == before


def test_default_names_are_the_runs_with_flame_suffixes(tmp_path, monkeypatch):
    """Defect 11: flame and export both write <run>-flame.folded."""
    monkeypatch.chdir(tmp_path)
    assert main(["flame", str(CAP16) + "/."]) == 0
    assert main(["flame", str(CAP16), "--format", "folded"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["startup-cap16g-flame.folded", "startup-cap16g-flame.svg"]
