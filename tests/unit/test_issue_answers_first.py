"""Every output says the run's verdict first (issue 32 defects 3 and 4) and the issue bundle answers on its first
screen (issue 34 item 7). Real traces: the CPU TP=2 start-up (no allocator events), the H200 start-up that died
on a 16 GiB card, the b12x seed on the H200."""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

import markdown
import pytest
from memtrace.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
CPU_TP2 = DATA / "vllm-cpu-tp2" / "memtrace-run"
CAP16 = DATA / "h200" / "startup-cap16g"
SEED = DATA / "h200" / "seed-b12x-074"
DIED_AT = "DIED of CUDA OOM at 7.05 s in compile_or_warm_up/kernel_warmup"


def test_a_bundle_of_a_run_that_recorded_nothing_says_so_first_writes_only_what_it_links_and_exits_1(tmp_path, capsys):
    # it exited 0, said "It stayed under the target (21.66 GiB)", listed timeline.png, flame.svg and flame.folded
    # on stderr (none existed) and linked them
    out = tmp_path / "b"
    assert main(["issue", str(CPU_TP2), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["issue.md"]
    assert f"wrote {out}/issue.md\n" in err and "timeline.png" not in err and "flame" not in err
    md = (out / "issue.md").read_text()
    first = md.split("\n\n")[1]
    assert first.startswith("**Recorded nothing: ranks 0-1 recorded no allocator events")
    assert "no target was kept or crossed" in first
    for claim in ("stayed under the target", "never crossed", "(timeline.png)", "(flame.svg)", "Peak PyTorch"):
        assert claim not in md, claim


def test_force_over_an_older_bundle_leaves_no_picture_the_new_one_did_not_draw(tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["issue", str(SEED), "-o", str(out)]) == 0
    assert (out / "timeline.png").exists()
    assert main(["issue", str(CPU_TP2), "-o", str(out), "--force"]) == 1
    assert sorted(p.name for p in out.iterdir()) == ["issue.md"]


def test_a_single_process_api_trace_on_a_cpu_machine_gets_no_peak_outside_any_phase(tmp_path, capsys):
    # it got "Peak PyTorch reserved memory 0.00 GiB outside any phase"
    pytest.importorskip("torch")
    import memtrace

    with memtrace.trace(tmp_path / "run"), memtrace.phase("step"):
        pass
    assert main(["issue", str(tmp_path / "run"), "-o", str(tmp_path / "b")]) == 1
    md = (tmp_path / "b" / "issue.md").read_text()
    assert md.split("\n\n")[1].startswith("**Recorded nothing: the process recorded no allocator events")
    assert "0.00 GiB outside any phase" not in md and "reserved 0.00 GiB" not in md
    assert main(["report", str(tmp_path / "run")]) == 0
    assert capsys.readouterr().out.startswith("Recorded nothing: the process recorded no allocator events")


def test_every_output_of_a_run_that_died_says_so_first(tmp_path, capsys):
    # the view's title was "GPU memory during start-up: record_startup.py, NVIDIA H200 as a 16 GiB card" and "DIED"
    # appeared only in the embedded report below the phase table
    import json
    import re

    assert main(["view", str(CAP16), "-o", str(tmp_path / "v.html")]) == 0
    page = (tmp_path / "v.html").read_text()
    assert re.search(r"<title>DIED of CUDA OOM at 7\.05 s in compile_or_warm_up/kernel_warmup — GPU memory", page)
    doc = json.loads(re.search(r'<script type="application/json" id="mt-doc">(.*?)</script>', page).group(1))
    assert doc["title"].startswith(DIED_AT) and doc["verdict"] == "died"
    assert doc["headline"].startswith("DIED: the process ran out of CUDA memory at 7.05 s")
    assert "requested 1024.00 MiB" in doc["headline"]
    assert main(["report", str(CAP16)]) == 0
    assert capsys.readouterr().out.startswith("DIED: the process ran out of CUDA memory at 7.05 s")
    assert main(["flame", str(CAP16), "-o", str(tmp_path / "f.svg")]) == 0
    svg = (tmp_path / "f.svg").read_text()
    assert ">DIED of CUDA OOM at 7.05 s — Live GPU memory at the reserved peak" in svg
    assert "died of CUDA OOM in compile_or_warm_up/kernel_warmup" in svg
    assert main(["issue", str(CAP16), "-o", str(tmp_path / "b")]) == 0
    md = (tmp_path / "b" / "issue.md").read_text()
    assert md.startswith(f"## {DIED_AT} — GPU memory during start-up")
    assert md.split("\n\n")[1].startswith("**DIED: the process ran out of CUDA memory at 7.05 s")


def test_the_timeline_title_of_a_run_that_died_says_so_first():
    from memtrace.analysis.analysed.run import analyse
    from memtrace.analysis.analysed.titles import timeline_title
    from memtrace.store import load_run

    run = analyse(load_run(CAP16).traces, path=str(CAP16))
    assert timeline_title(run).startswith(DIED_AT + " — GPU memory during start-up: record_startup.py")
    full = analyse(load_run(DATA / "h200" / "startup-full").traces, path="startup-full")
    assert timeline_title(full).startswith("GPU memory during start-up: record_startup.py")


@pytest.fixture(scope="module")
def seed_bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("seed") / "b"
    assert main(["issue", str(SEED), "-o", str(out), "--attach-trace"]) == 0
    return out


def test_the_seed_bundle_answers_on_its_first_screen(seed_bundle):
    # it was 160 lines: a one-line summary, a 600-character allocator line and a 40-row phase table, unfolded
    lines = (seed_bundle / "issue.md").read_text().splitlines()
    picture = lines.index("![GPU memory during start-up](timeline.png)")
    assert picture < 30 and picture < lines.index("## Environment")
    screen = "\n".join(lines[:picture])
    assert "**No target to compare with: PyTorch reserved peaked at 6.84 GiB.**" in screen
    assert "PyTorch reserved 6.84 GiB at 10.34 s in `moe_layer_39`" in screen  # the peak, where
    assert "3.75 GiB (56 %) `blackwell_sm12x/moe_dispatch.py:2781 allocate_sm120_dynamic_workspace`" in screen
    # the hooked workspace bytes, nested calls counted once
    assert "Hooked workspace allocators** returned 6.71 GiB in 40 outermost calls" in screen
    assert "`allocate_sm120_moe_workspace` 5.46 GiB (80 calls)" in screen
    assert max(len(x) for x in lines[:picture]) < 400  # no 600-character settings line on the first screen


def test_the_seed_bundle_folds_its_long_tables_as_github_renders_them(seed_bundle):
    md = (seed_bundle / "issue.md").read_text()
    head, folded = md.split("<details", 1)
    assert "moe_layer_0 |" not in head and "roundup_power2_divisions" not in head
    assert "| moe_layer_0 |" in folded and "roundup_power2_divisions" in folded
    html = markdown.markdown(md, extensions=["tables", "fenced_code", "md_in_html"])
    assert html.count("<details") == 2 and html.index("<img") < html.index("<h2>Environment</h2>")
    report = html.split("<details", 2)[2]
    assert (
        "<summary>The whole report: 40 phases, the peak, the target, top holders, 200 hook calls, definitions" in report
    )
    assert report.count("<tr>") > 40  # the phase table is a table inside the fold, not text


def test_the_bundle_attaches_the_trace_compressed_byte_for_byte(seed_bundle, capsys):
    src = next(SEED.glob("*.memtrace"))
    packed = seed_bundle / (src.name + ".xz")
    assert lzma.decompress(packed.read_bytes()) == src.read_bytes()
    assert packed.stat().st_size < src.stat().st_size / 4
    assert main(["report", str(packed)]) == 0  # every reader opens it as it is
    assert "1,581 allocator events" in capsys.readouterr().out


def test_the_attached_trace_of_an_imported_snapshot_is_a_memtrace_file_not_a_pickle(tmp_path, capsys):
    snap = DATA / "snapshots" / "python-stacks.pickle"
    copy = tmp_path / snap.name
    shutil.copy(snap, copy)
    assert main(["issue", str(copy), "-o", str(tmp_path / "b"), "--attach-trace"]) == 0
    attached = sorted((tmp_path / "b").glob("*.memtrace.xz"))
    assert attached and all(lzma.decompress(p.read_bytes())[:16] == b"SQLite format 3\x00" for p in attached)
