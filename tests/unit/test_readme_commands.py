"""Every memtrace command line the README and docs/ show parses (each flag is one the command accepts), and
every output the README quotes is what the command prints today (issue 34)."""

from __future__ import annotations

import argparse
import glob
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


# Every command the pages quote runs (issue 41): as written where it names shipped data, a synopsis with its
# placeholders standing for shipped runs and its optional parts left out. A command that needs what this machine
# cannot give (a GPU running vLLM, a live server) is skipped, named so.

#: a synopsis's placeholders -> the shipped data they stand for (paths from the repository root)
PLACEHOLDERS = {
    "RUN": "tests/data/vllm-h200-034-grid/g08",  # a vLLM 0.34 start-up: the what-if model reads its flags
    "BASE": "tests/data/h200/seed-b12x-0613",
    "NEW": "tests/data/h200/seed-b12x-074",
    "SNAPSHOT.pickle": "tests/data/snapshots/python-stacks.pickle",
    "FILE": "tests/data/snapshots/python-stacks.pickle",
    "SIZE": "24GiB",
}
#: why a command cannot run here, by what it asks
NEEDS = {
    "memtrace run ": "needs a GPU running vLLM (it starts `vllm serve`)",
    "memtrace window ": "needs a live vLLM server recording in serving mode (it asks it to write its window)",
    "--wheel ": "needs a vLLM or FlashInfer wheel file",
    "--serve ": "serves the page until Ctrl-C (tests/browser drive it)",
}


def _inline_commands() -> list[tuple[str, str]]:
    """(page, command) for every complete command quoted in a page's prose: one naming shipped data or a run
    placeholder, with no ellipsis or alternatives in prose ("--what-if / --suggest")."""
    out = []
    for page in PAGES:
        prose = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S).replace("\n", " ")
        for m in re.finditer(r"`((?:\.venv/bin/)?memtrace \w[^`]*)`", prose):
            cmd = re.sub(r"\s+", " ", m.group(1)).strip()
            words = cmd.split()
            if any(w in ("/", "...", "…") for w in words):
                continue
            if any(w.startswith("tests/data/") or w in PLACEHOLDERS for w in words[2:]) or words[1:] == ["doctor"]:
                out.append((page.name, cmd))
    return out


def _runnable(line: str) -> list[str]:
    """A synopsis as commands: optional [...] parts left out, placeholders replaced by shipped data, one command
    per format of a ``-f a|b|c`` and the first of any other a|b alternative (``history add|check|...``)."""
    while re.search(r"\[[^\[\]]*\]", line):
        line = re.sub(r"\s*\[[^\[\]]*\]", "", line)
    words = line.split()
    at = next((i + 1 for i, w in enumerate(words[:-1]) if w in ("-f", "--format")), None)
    out = []
    for fmt in words[at].split("|") if at is not None else [None]:
        picked = [w.split("|", 1)[0] for w in words]
        if at is not None:
            picked[at] = fmt
        out.append(" ".join(PLACEHOLDERS.get(w, w) for w in picked))
    return out


ALL_COMMANDS = sorted(set(LINES) | set(_inline_commands()))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder to run the pages' commands in: ``tests`` is the repository's, a recorded run is where ``memtrace
    run`` leaves it (``memtrace-<time>/``), and /tmp/memtrace-demo is a folder of its own."""
    work = tmp_path_factory.mktemp("docs-commands")
    (work / "tests").symlink_to(ROOT / "tests")
    (work / "memtrace-20261202-173538").symlink_to(ROOT / "tests" / "data" / "vllm-h200" / "startup-stacks")
    (work / "demo").mkdir()
    return work


@pytest.mark.parametrize(("page", "line"), ALL_COMMANDS, ids=[f"{p}:{ln[:70]}" for p, ln in ALL_COMMANDS])
def test_every_command_the_pages_quote_runs_here(page, line, workdir, tmp_path):
    need = next((why for key, why in NEEDS.items() if key in line + " "), None)
    if need:
        pytest.skip(f"{page}: {line!r} {need}")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for name in ("tests", "memtrace-20261202-173538"):
        (cwd / name).symlink_to(workdir / name)
    for cmd in _runnable(line):
        cmd = re.sub(r"^(\.venv/bin/)?memtrace ", "", cmd.replace("/tmp/memtrace-demo", str(workdir / "demo")))
        words = [
            w for word in shlex.split(cmd) for w in (sorted(glob.glob(word, root_dir=cwd)) if "*" in word else [word])
        ]
        done = subprocess.run([sys.executable, "-m", "memtrace", *words], cwd=cwd, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        # 0 or a verdict (1: dies, grew, would not fit); never a usage error (2) nor a traceback
        assert done.returncode in (0, 1), f"{page}: {cmd}\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr and "memtrace: error:" not in done.stderr, done.stderr[-2000:]
        assert done.stdout.strip() or "memtrace: wrote" in done.stderr  # it said or wrote something


def test_the_reading_page_names_every_export_format():
    line = next(ln for page, ln in LINES if page == "reading.md" and ln.startswith("memtrace export"))
    listed = re.search(r"-f (\S+)", line).group(1).split("|")
    assert sorted(listed) == sorted(_subparsers()["export"]._option_string_actions["-f"].choices)


def test_the_what_if_flags_the_guide_lists_are_the_ones_fits_help_lists():
    guide = (ROOT / "docs" / "whatif.md").read_text(encoding="utf-8")
    listed = re.search(r"^Flags: (.*?)\n\n", guide, re.S | re.M).group(1)
    helped = _subparsers()["fits"]._option_string_actions["--what-if"].help
    flags = re.findall(r"`([a-z-]+(?:=[^`]+)?)`", listed)
    assert len(flags) == 8 and [f for f in flags if f not in helped] == []
