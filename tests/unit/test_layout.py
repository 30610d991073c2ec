"""The package layout: the user's top-level folders map onto one import package, `memtrace`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
ROOTS = {"memtrace": "tracer", "memtrace.plugins": "plugins", "memtrace.plots": "plots"}
#: Folders of data the wheel ships, listed as packages so setuptools installs them without a warning.
DATA_PACKAGES = {"memtrace.plots.assets": "plots/assets"}


def _packages_on_disk() -> set[str]:
    found = set()
    for package, folder in ROOTS.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            parts = [] if rel == Path(".") else list(rel.parts)
            found.add(".".join([package, *parts]))
    return found


def test_every_subpackage_on_disk_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    assert listed == _packages_on_disk() | set(DATA_PACKAGES)
    for folder in DATA_PACKAGES.values():
        assert not (ROOT / folder / "__init__.py").exists() and any((ROOT / folder).iterdir())


def test_package_dir_maps_the_user_folders():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["tool"]["setuptools"]["package-dir"] == ROOTS


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    return set(out.stdout.split())


HEAVY = {"torch", "matplotlib", "vllm", "flashinfer", "pynvml"}


def test_import_memtrace_imports_no_torch_matplotlib_or_vllm():
    assert not HEAVY & _modules_after("import memtrace; memtrace.__version__")


def test_building_the_cli_imports_no_heavy_module():
    # every command module is imported to build --help: each must keep its heavy imports inside run()
    assert not HEAVY & _modules_after("import memtrace.cli; memtrace.cli.build_parser()")


def test_memtrace_never_imports_its_modules_through_the_repo_folder_names():
    # From the repo root (where `python -m pytest` runs, putting it on sys.path) `import plugins`
    # works by accident; memtrace's own modules must only ever be reached as `memtrace.*`.
    code = (
        "import importlib, pkgutil\n"
        "for root in ('memtrace', 'memtrace.plugins', 'memtrace.plots'):\n"
        "    pkg = importlib.import_module(root)\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, root + '.'):\n"
        "        m.name.endswith('__main__') or importlib.import_module(m.name)\n"
        "import sys; print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    loaded = set(out.stdout.split())
    assert "memtrace.plugins.vllm" in loaded and "memtrace.plots.timeline" in loaded
    assert not {"tracer", "plugins", "plots"} & {name.split(".")[0] for name in loaded}


def test_every_data_file_beside_the_code_ships_in_the_wheel():
    """A file the code reads at run time (the shipped priors, the view's assets) is in package-data: a wheel
    without it would fail only on a user's machine."""
    import fnmatch

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = config["tool"]["setuptools"]["package-data"]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    missing = []
    for package, folder in ROOTS.items():
        for f in tracked:
            if not f.startswith(folder + "/") or f.endswith(".py"):
                continue
            rel = Path(f).relative_to(folder)
            pkg = ".".join([package, *rel.parent.parts]) if rel.parent != Path(".") else package
            if not any(fnmatch.fnmatch(rel.name, pat) for pat in data.get(pkg, [])):
                missing.append(f)
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
