"""The ``memtrace`` command line: one module per subcommand, listed in :data:`COMMANDS` in ``--help``'s order.

A command module defines ``NAME`` (the verb), a docstring (its help text), ``add_arguments(parser)`` and
``run(args) -> int``. It must be cheap to import: heavy imports (matplotlib, torch) go inside ``run``. Nothing
outside ``memtrace.cli`` imports it. Adding a command is one module plus its place in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import sys

from memtrace.cli import diff, doctor, export, fits, flame, history, import_, issue, plot, report, run, view, window
from memtrace.errors import MemtraceError

#: every command, in the order ``memtrace --help`` lists them
COMMANDS = (run, window, report, plot, flame, view, diff, fits, history, issue, export, import_, doctor)


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in memtrace's one line (argparse prints the usage first: two lines or more).
    Subcommands' parsers are of this class too (argparse makes them of their parent's class)."""

    def error(self, message: str):
        sub = self.prog.removeprefix("memtrace").strip()
        where = f"{sub}: " if sub else ""
        help_cmd = f"{self.prog} --help"
        self.exit(2, f"memtrace: error: {where}{message} (see {help_cmd})\n")


def build_parser() -> argparse.ArgumentParser:
    from memtrace import __version__

    parser = _Parser(
        prog="memtrace",
        description="An exact timeline of GPU memory during vLLM start-up: what filled the GPU, when, and who asked.",
    )
    parser.add_argument("--version", action="version", version=f"memtrace {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in COMMANDS:
        doc = (mod.__doc__ or "").strip()
        p = sub.add_parser(
            mod.NAME,
            help=doc.splitlines()[0] if doc else None,
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _allow_negative_values(p)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _allow_negative_values(p: argparse.ArgumentParser) -> None:
    """Read "-5GiB" or "-2%" after an option as its value (argparse would take it for an option and say
    "expected one argument"), so the value's own parser refuses it in one line, in every command."""
    import re

    p._negative_number_matcher = re.compile(r"^-\.?\d")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``memtrace`` console script. Returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except MemtraceError as exc:
        print(f"memtrace: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("memtrace: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
