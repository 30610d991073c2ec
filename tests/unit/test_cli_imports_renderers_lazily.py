"""Building the CLI (``memtrace --help``) imports no renderer; rendering imports only the one it uses."""

import json
import subprocess
import sys
from pathlib import Path

from memtrace.plots import formats, render

RENDERERS = sorted({f.load().__name__ for f in formats.FORMATS})  # imported here, in this process only


def _loaded(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {RENDERERS!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_building_the_parser_of_every_command_imports_no_renderer():
    code = (
        "import contextlib, io; from memtrace.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: main(['--help'])\n"
        "    except SystemExit: pass\n"
        "    for c in ('report', 'flame', 'export', 'fits', 'diff', 'plot', 'view', 'issue'):\n"
        "        try: main([c, '--help'])\n"
        "        except SystemExit: pass"
    )
    assert _loaded(code) == []


def test_every_format_is_named_once_and_loads_a_module_that_renders():
    names = [f.name for f in formats.FORMATS]
    assert len(names) == len(set(names)) == len(render.FORMATS) == 15
    for f in formats.FORMATS:
        module = f.load()
        assert module.__name__.startswith("memtrace.plots.") and callable(module.render), f.name
    assert {f.name for f in formats.FORMATS if f.binary} == {"timeline", "memory-viz"}


def test_flame_and_export_offer_their_formats_from_the_table():
    assert sorted(render.offered_by("flame")) == ["folded", "svg"]
    assert sorted(render.offered_by("export")) == ["csv", "folded", "memory-viz", "perfetto"]


def test_a_report_of_a_memtrace_file_imports_neither_the_plugin_nor_the_profiler_reader(tmp_path):
    """``run``'s --until choices imported the whole vLLM plugin (27 ms) into every command's parser, and every
    file load imported the Kineto reader (7 ms) to test a suffix; a report of a .memtrace file needs neither."""
    trace = Path(__file__).resolve().parents[1] / "data" / "h200" / "startup-cap16g"
    probe = (
        "import contextlib, io, json, sys; from memtrace.cli import main\n"
        f"with contextlib.redirect_stdout(io.StringIO()): main(['report', {str(trace)!r}])\n"
        "mods = ('memtrace.plugins.vllm', 'memtrace.plugins.hooks', 'memtrace.importers.kineto',\n"
        "        'memtrace.analysis.capacity.whatif', 'memtrace.analysis.capacity.fits')\n"
        "print(json.dumps([m for m in mods if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
