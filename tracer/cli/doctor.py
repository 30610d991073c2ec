"""Check that memtrace still hooks your vLLM, FlashInfer and torch, before a start-up.

Every path memtrace hooks or reads (the table in memtrace.plugins.surface) is looked up in the
library's source, read, never imported: found, moved (the module now defining it is named) or
missing, with the releases the table knows. Exit 1 when a path a start-up trace relies on is missing
where the table says it exists; a library that is not installed is said, not failed.

  memtrace doctor                                   # the installed vLLM, FlashInfer and torch
  memtrace doctor --wheel vllm-0.35.0-cp38-abi3-manylinux_2_28_x86_64.whl
  memtrace doctor --wheel ./vllm-src --version 0.35.0   # a source tree (the folder holding vllm/)
  memtrace doctor --markdown > docs/vllm-flashinfer-surface.md
"""

from __future__ import annotations

import argparse
import sys

NAME = "doctor"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wheel",
        action="append",
        metavar="WHEEL|DIR",
        help="check a release's wheel or source tree instead of what is installed (repeatable)",
    )
    p.add_argument(
        "--version", dest="release", metavar="X.Y.Z", help="the release of a source tree without _version.py"
    )
    p.add_argument("--all", action="store_true", help="also list the paths the table gives other releases")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown (docs/) and exit")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memtrace.errors import UsageError
    from memtrace.plugins import doctor, surface

    if args.markdown:
        sys.stdout.write(surface.support_markdown())
        return 0
    sources = []
    if args.wheel:
        for item in args.wheel:
            path = Path(item)
            if not path.exists():
                raise UsageError(f"--wheel {item}: no such file or folder")
            try:
                sources.append(doctor.from_tree(path, args.release) if path.is_dir() else doctor.from_wheel(path))
            except (ValueError, OSError) as exc:
                raise UsageError(str(exc)) from None
    else:
        for library in surface.DISTRIBUTIONS:
            found = doctor.installed(library)
            if found is None:
                print(f"{library}: not installed (nothing to check)")
            else:
                sources.append(found)
    failed = 0
    for source in sources:
        report = doctor.check(source)
        _print(report, args.all)
        failed += len(report.failed)
    if failed:
        print(f"memtrace doctor: {failed} path(s) a start-up trace relies on are missing; see above")
        return 1
    return 0


def _print(report, show_all: bool) -> None:
    from memtrace.plugins import surface

    source = report.source
    span = surface.range_text(source.library)
    version = surface.parse_version(source.version)
    known = (
        ""
        if not span
        else (
            f" (the table knows {span})"
            if surface.is_supported(version, source.library)
            else f" (outside {span}, the releases the table knows)"
        )
    )
    print(f"{source.where}{known}")
    rest = 0
    for c in report.checks:
        if not c.applies and not show_all:
            rest += 1
            continue
        status = c.status if c.applies else f"not listed for {source.version}: {c.status}"
        if c.status == "moved":
            status = f"moved to {c.moved_to}"
        flag = "" if c.entry.required or not c.applies else " (optional)"
        print(
            f"  {status:<34} {c.entry.path}  [{c.entry.role}, {surface.span_text(c.entry)}]{flag if c.status != 'found' else ''}"
        )
    if rest:
        print(f"  ({rest} path(s) the table gives other releases not shown; --all lists them)")
