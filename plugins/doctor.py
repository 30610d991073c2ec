"""Check the paths of :mod:`.surface` against a library's source: installed, a wheel, or a source tree.

Nothing is imported: sources are read with ``ast`` (from the installed distribution's files, found
through ``importlib.metadata``, or from inside a wheel's zip). For each entry that exists in the
release by the table: *found* (defined where the table says), *moved* (not there, but a definition of
that name is elsewhere in the release: the module is named) or *missing*. Entries the table lists for
other releases are shown too, as present or absent, so a range that is too narrow shows up.
``memtrace doctor`` (``memtrace.cli.doctor``) prints these and exits 1 when a required one is missing.
"""

from __future__ import annotations

import ast
import re
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from memtrace.plugins import surface
from memtrace.plugins.surface import Entry, parse_version

#: Distribution names (normalized) -> library of the table.
_LIBRARY = {d.replace("_", "-").lower(): lib for lib, dists in surface.DISTRIBUTIONS.items() for d in dists}


@dataclass
class Source:
    """The files of one release of one library: ``read(relpath) -> text or None`` and every ``.py`` path."""

    library: str
    version: str | None
    where: str
    read: Callable[[str], str | None]
    files: Callable[[], list[str]]


@dataclass(frozen=True)
class Check:
    entry: Entry
    applies: bool
    status: str  # found / moved / missing (applies) or present / absent (not listed for this release)
    moved_to: str | None = None


@dataclass
class Report:
    source: Source
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        """The required entries this release should have and does not have where the table says."""
        return [c for c in self.checks if c.applies and c.entry.required and c.status != "found"]


def _module_file(module: str) -> tuple[str, str]:
    base = module.replace(".", "/")
    return f"{base}.py", f"{base}/__init__.py"


def defined(text: str | None, qualname: str) -> bool:
    """Whether ``qualname`` (``func``, ``NAME``, ``Class.method``) is defined at the top of a module's source:
    a ``def``, an assignment, a name imported into it, or a class's own method or attribute."""
    if text is None:
        return False
    tree = ast.parse(text)
    parts = qualname.split(".")
    if len(parts) == 1:
        return any(parts[0] in _names(node) for node in tree.body)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == parts[0]:
            return any(parts[1] in _names(m) for m in node.body)
    return False


def _names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, ast.ImportFrom):
        return {a.asname or a.name for a in node.names}
    return set()


def _read_module(source: Source, module: str) -> str | None:
    for rel in _module_file(module):
        text = source.read(rel)
        if text is not None:
            return text
    return None


def _moved(source: Source, entry: Entry) -> str | None:
    """The module elsewhere in the release that defines ``entry``'s name (a cheap text filter first)."""
    qual = entry.qualname
    word = re.compile(rf"\b(def|class)\s+{re.escape(qual.split('.')[-1])}\b|^{re.escape(qual)}\s*[:=]", re.M)
    # its own module, and those where the table hooks the same name already (the V2 runner's GPUModelRunner
    # is not where the V1 runner's moved)
    own = {f for e in surface.TABLE if e.qualname == qual for f in _module_file(e.source_module)}
    for rel in source.files():
        if rel in own:
            continue
        text = source.read(rel)
        if text and word.search(text) and defined(text, qual):
            return rel.removesuffix("/__init__.py").removesuffix(".py").replace("/", ".")
    return None


def check(source: Source) -> Report:
    """Every entry of ``source.library`` in the table, checked against ``source``."""
    version = parse_version(source.version)
    report = Report(source)
    for entry in surface.TABLE:
        if entry.library != source.library:
            continue
        found = defined(_read_module(source, entry.source_module), entry.qualname)
        applies = entry.applies_to(version)
        if found:
            status, moved = ("found" if applies else "present"), None
        elif not applies:
            status, moved = "absent", None
        else:
            moved = _moved(source, entry)
            status = "moved" if moved else "missing"
        report.checks.append(Check(entry, applies, status, moved))
    return report


# -- sources -------------------------------------------------------------------------------------


def installed(library: str) -> Source | None:
    """The installed distribution of ``library`` (None: not installed)."""
    from importlib import metadata

    for name in surface.DISTRIBUTIONS[library]:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        files = [str(f) for f in dist.files or () if str(f).endswith(".py")]

        def read(rel: str, dist=dist) -> str | None:
            path = Path(str(dist.locate_file(rel)))
            return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None

        where = str(Path(str(dist.locate_file(""))))
        return Source(library, dist.version, f"{name} {dist.version} installed in {where}", read, lambda f=files: f)
    return None


def from_wheel(path: Path) -> Source:
    """A release from its wheel (``.whl``), read inside the zip; ValueError when it is not a known library's."""
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise ValueError(f"{path}: not a wheel (not a zip file)") from None
    names = zf.namelist()
    meta = next((n for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)), None)
    if meta is None:
        raise ValueError(f"{path}: no .dist-info/METADATA inside; is it a wheel?")
    fields = dict(_metadata_fields(zf.read(meta).decode("utf-8", "replace")))
    library = _LIBRARY.get(fields.get("Name", "").replace("_", "-").lower())
    if library is None:
        raise ValueError(f"{path}: {fields.get('Name')!r} is none of {', '.join(sorted(_LIBRARY))}")
    members = set(names)

    def read(rel: str) -> str | None:
        return zf.read(rel).decode("utf-8", "replace") if rel in members else None

    py = [n for n in names if n.endswith(".py")]
    version = fields.get("Version")
    return Source(library, version, f"{fields.get('Name')} {version} (wheel {path.name})", read, lambda: py)


def from_tree(path: Path, version: str | None = None) -> Source:
    """A source tree: the folder holding the top-level package (``vllm/``, ``flashinfer/``); the version
    from ``version``, else the package's ``_version.py``/``version.py``; ValueError when there is none."""
    library = next(
        (lib for lib in ("vllm", "flashinfer") if (path / lib / "__init__.py").is_file() or (path / lib).is_dir()), None
    )
    if library is None:
        raise ValueError(f"{path}: holds no vllm/ or flashinfer/ package folder")
    if version is None:
        for rel in ("_version.py", "version.py"):
            f = path / library / rel
            m = (
                re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", f.read_text())
                if f.is_file()
                else None
            )
            if m:
                version = m.group(1)
                break
    if version is None:
        raise ValueError(f"{path}: no {library}/_version.py to read the release from; pass --version")

    def read(rel: str) -> str | None:
        f = path / rel
        return f.read_text(encoding="utf-8", errors="replace") if f.is_file() else None

    def files() -> list[str]:
        return [str(p.relative_to(path)) for p in sorted((path / library).rglob("*.py"))]

    return Source(library, version, f"{library} {version} (source tree {path})", read, files)


def _metadata_fields(text: str) -> Iterator[tuple[str, str]]:
    for line in text.splitlines():
        if not line.strip():
            return  # the headers end at the first blank line
        key, sep, value = line.partition(":")
        if sep and not key.startswith(" "):
            yield key.strip(), value.strip()
