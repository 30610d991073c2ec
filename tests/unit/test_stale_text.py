"""Text that states a figure or names a file says what the code and the data say today (issue 21)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from memtrace.cli import main
from testdata import unpacked

ROOT = Path(__file__).resolve().parents[2]


def _bytes(text: str) -> list[int]:
    return [int(x.replace(",", "")) for x in re.findall(r"(\d{1,3}(?:,\d{3})+) B", text)]


def test_the_vllm_h200_readme_states_the_reconciliation_the_report_computes(capsys):
    readme = (ROOT / "tests" / "data" / "vllm-h200" / "README.md").read_text()
    para = readme.split("**Reconciliation**", 1)[1].split("\n\n", 1)[0]
    assert main(["report", str(unpacked(ROOT / "tests" / "data" / "vllm-h200" / "startup")), "--json"]) == 0
    k = json.loads(capsys.readouterr().out)["traces"][0]["non_kv"]["reconstruction"]
    stated = _bytes(para)
    assert stated[:2] == [k["available_kv_bytes"], k["vllm_available_kv_bytes"]]
    assert stated[2] == k["difference_bytes"] == k["available_kv_bytes"] - k["vllm_available_kv_bytes"]
    assert k["init_gap_bytes"] in stated and k["torch_peak_increase_bytes"] in stated
    assert "the report prints +1.02\nMiB" in para or "the report prints +1.02 MiB" in para


def test_no_file_cites_a_design_document_the_repository_does_not_hold():
    cited = []
    for path in [
        *ROOT.glob("tracer/**/*.py"),
        *ROOT.glob("plots/**/*.py"),
        *ROOT.glob("tests/**/*.py"),
        *ROOT.glob("*.md"),
    ]:
        if "DESIGN.md" in path.read_text(errors="replace") and path.name != Path(__file__).name:
            cited.append(str(path.relative_to(ROOT)))
    assert (ROOT / "DESIGN.md").exists() or cited == []
