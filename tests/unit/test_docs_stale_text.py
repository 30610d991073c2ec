"""The texts issue 34 found stale say what the code and the shipped data say (item 10)."""

from __future__ import annotations

import re
from pathlib import Path

from memtrace.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _newest_vllm_in_the_table() -> str:
    from memtrace.plugins.surface import CHECKED

    return ".".join(CHECKED["vllm"][-1].split(".")[:2])


def test_the_recording_page_names_the_vllm_range_the_plugins_table_covers():
    newest = _newest_vllm_in_the_table()
    text = (DOCS / "recording.md").read_text()
    assert f"covers vLLM\n0.25 to {newest}" in text
    rows = re.findall(r"^\| (0\.\d+)\.\d+ \|", (DOCS / "vllm-versions.md").read_text(), re.M)
    assert rows[-1] == newest


def test_no_page_claims_no_cost_without_saying_on_which_vllm():
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        for m in re.finditer(r"no cost measurable", page.read_text()):
            before = page.read_text()[max(0, m.start() - 40) : m.start()]
            assert "0.25.1" in before, page.name


def test_the_start_up_counts_are_the_shipped_folders():
    versions = (DOCS / "vllm-versions.md").read_text()
    vllm_startups = ["startup", "startup-stacks", "startup-cupti", "shared-gpu", "cost-round4-cupti", "cost-round4-on"]
    assert all(any((ROOT / "tests/data/vllm-h200" / d).glob("*.memtrace*")) for d in vllm_startups)
    assert f"H200, {len(vllm_startups)} start-ups" in versions
    measured = (DOCS / "measured.md").read_text()
    n = len(list((ROOT / "tests/data/h200").glob("startup-*")))
    assert f"all {n} runs of `tests/data/h200/startup-*`" in measured


def test_memtrace_run_help_no_longer_says_it_appends_to_a_vllm_variable():
    parser = build_parser()
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    text = sub.choices["run"].format_help()
    assert "is appended to ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY``" not in text
    assert "MEMTRACE_DIR" in text and "no vLLM variable is changed" in text


def test_the_design_page_states_the_format_version_the_code_writes():
    from memtrace.model import FORMAT_VERSION

    text = (DOCS / "design.md").read_text()
    assert f"format `memtrace-trace`, version {FORMAT_VERSION[0]}.{FORMAT_VERSION[1]};" in text
