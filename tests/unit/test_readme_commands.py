"""Every memtrace command line the README and docs/ show parses (each flag is one the command accepts), and
every output the README quotes is what the command prints today (issue 34)."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from memtrace.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, re.S)


def _command_lines() -> list[tuple[str, str]]:
    """(page, line) for every line of a code block that runs memtrace."""
    out = []
    for page in PAGES:
        for block in _blocks(page.read_text(encoding="utf-8")):
            for raw in re.sub(r"\\\n\s*", " ", block).splitlines():  # join shell line continuations
                for part in raw.split("&&"):
                    part = part.split("  #", 1)[0].strip().removeprefix("$ ")
                    part = re.sub(r"^(\S+=\S+\s+)+", "", part)  # MEMTRACE=1 ... prefixes
                    if re.match(r"(\.venv/bin/)?memtrace \w", part):
                        out.append((page.name, part))
    return out


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


LINES = _command_lines()


def test_the_readme_shows_the_commands_a_newcomer_needs():
    shown = {line.split()[1] for page, line in LINES if page == "README.md"}
    assert {"run", "report", "plot", "flame", "fits", "diff", "issue"} <= shown


@pytest.mark.parametrize(("page", "line"), LINES, ids=[f"{p}:{ln[:60]}" for p, ln in LINES])
def test_every_flag_shown_is_one_the_command_accepts(page, line):
    words = shlex.split(line.replace("[", " ").replace("]", " ").replace("|", " "))
    words = words[: words.index("--")] if "--" in words else words
    sub = words[1]
    parsers = _subparsers()
    assert sub in parsers, f"{page}: memtrace has no command {sub!r}"
    known = set(parsers[sub]._option_string_actions)
    flags = [
        f.split("=", 1)[0] for w in words[2:] if w.startswith("-") and not re.match(r"-\d", w) for f in w.split("/")
    ]
    assert [f for f in flags if f not in known] == [], f"{page}: {line}"


@pytest.mark.parametrize("sub", sorted({line.split()[1] for _, line in LINES}))
def test_each_command_shown_answers_help(sub):
    done = subprocess.run([sys.executable, "-m", "memtrace", sub, "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith(f"usage: memtrace {sub}")


def _quoted_outputs() -> list[tuple[str, list[str]]]:
    out = []
    for block in _blocks((ROOT / "README.md").read_text(encoding="utf-8")):
        lines = block.rstrip("\n").splitlines()
        if lines and lines[0].startswith("$ memtrace "):
            out.append((lines[0][2:], [ln for ln in lines[1:] if ln.strip() != "..."]))
    return out


@pytest.mark.parametrize(("command", "shown"), _quoted_outputs(), ids=lambda x: str(x)[:50])
def test_every_output_the_readme_quotes_is_printed_today(command, shown):
    argv = shlex.split(command)[1:]
    done = subprocess.run([sys.executable, "-m", "memtrace", *argv], cwd=ROOT, capture_output=True, text=True)
    printed = done.stdout.splitlines()
    assert shown and [ln for ln in shown if ln not in printed] == []
