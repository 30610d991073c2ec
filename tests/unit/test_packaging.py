"""What the package index gets: the Apache-2.0 LICENSE in sdist and wheel, and a long description whose
links all work on the index's page (issue 34, item 8). `.ci/run` builds both and runs `twine check`."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_license_file_is_apache_2_and_ships_in_the_package():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert (
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "END OF TERMS AND CONDITIONS" in text
    )
    assert CONFIG["license"] == "Apache-2.0" and CONFIG["license-files"] == ["LICENSE"]


def test_the_long_description_has_only_absolute_links_and_is_short():
    readme = CONFIG["readme"]
    assert readme["content-type"] == "text/markdown"
    text = (ROOT / readme["file"]).read_text()
    targets = re.findall(r"\]\(([^)]+)\)", text) + re.findall(r'src="([^"]+)"', text)
    assert all(t.startswith("https://") for t in targets), targets
    assert len(text) < 4000 and "pip install memtrace-vllm" in text


def test_ci_builds_outside_the_repo_and_runs_twine_check():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "mktemp -d" in ci and '-m build -o "$pkg/dist"' in ci and "twine check --strict" in ci
