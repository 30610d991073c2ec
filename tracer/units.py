"""Sizes as users type them ("32GiB", "512MiB", "2%", "16000000000") and as reports print them.

Parsing happens at the edge (CLI arguments); everything inside memtrace stays integers of bytes.
Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal units (KB, MB, GB, TB) are powers of
1000, as on a GPU's box ("96 GB"). A bare number is bytes. A percentage is a fraction of something
the caller knows (a device's capacity, a baseline run's peak), so it is parsed separately.

Printing: reports, tables and headlines compare figures in GiB (``format_gib``, ``gib_number``,
``signed_gib_number``: "12.34 GiB", "12.34", "+0.12"). A figure too small for those decimals of GiB, one that
is not zero yet would print as zero ("0.00 GiB": under 0.005 GiB at two decimals), prints in the largest binary
unit that keeps it >= 1, with the same decimals and its unit even in a column headed GiB: "9.24 KiB",
"+1.02 MiB", "4 B" (a CPU profiler trace's KiB-sized peaks). Everything GiB can show, zero included, stays GiB.
The exact integers are in ``--json``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from memtrace.errors import UsageError

KiB = 1024
MiB = 1024**2
GiB = 1024**3

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": KiB,
    "kib": KiB,
    "mi": MiB,
    "mib": MiB,
    "gi": GiB,
    "gib": GiB,
    "ti": 1024**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int, *, at_least: str = "") -> int:
    """Bytes from "32GiB", "96 GB", "512MiB", "1.5g" or a plain integer; raises UsageError otherwise.

    Args:
        text: the size as typed. Units are case-insensitive; a bare number is bytes.
        at_least: the least size the caller takes, as its refusal words it ("1GiB, a card's memory"); a
            negative size is then refused with it (else with "zero or more bytes").
    Returns:
        The size in bytes, rounded to the nearest integer. Negative sizes are refused.
    """
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE_RE.match(str(text))
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _UNITS:
            raise UsageError(
                f"cannot read size {text!r}: write bytes or a number with a unit, e.g. 32GiB, 512MiB, 96GB"
            )
        value = round(float(m.group(1)) * _UNITS[unit])
    if value < 0:
        raise UsageError(
            f"size {text!r} is negative; give {f'at least {at_least}' if at_least else 'zero or more bytes'}"
        )
    return int(value)


def parse_fraction(text: str | float) -> float:
    """A fraction from "0.92" or "92%"; raises UsageError unless it lies in (0, 1]."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError(f"cannot read fraction {text!r}: write e.g. 0.92 or 92%") from None
    if not 0 < value <= 1:
        raise UsageError(f"fraction {text!r} must be above 0 and at most 1 (100%)")
    return value


@dataclass(frozen=True)
class Threshold:
    """An allowance typed as bytes ("512MiB") or as a share of a reference ("2%")."""

    bytes: int | None = None
    fraction: float | None = None

    def of(self, reference_bytes: int) -> int:
        """The allowance in bytes, given the reference a percentage applies to."""
        if self.bytes is not None:
            return self.bytes
        return round((self.fraction or 0.0) * reference_bytes)


def parse_threshold(text: str) -> Threshold:
    """A Threshold from "2%", "0.5%", "512MiB" or plain bytes; raises UsageError otherwise."""
    raw = str(text).strip()
    if raw.endswith("%"):
        try:
            pct = float(raw[:-1])
        except ValueError:
            raise UsageError(f"cannot read percentage {text!r}: write e.g. 2% or 0.5%") from None
        if pct < 0:
            raise UsageError(f"percentage {text!r} is negative; give 0% or more")
        return Threshold(fraction=pct / 100)
    m = _SIZE_RE.match(raw)
    if not m or m.group(2).lower() not in _UNITS:
        raise UsageError(f"cannot read limit {text!r}: write a percentage (2%) or a size (512MiB)")
    return Threshold(bytes=parse_size(raw))


def parse_sizes(text: str, *, at_least: str = "") -> list[int]:
    """Bytes from a comma-separated list: "16GiB,32GiB" (``at_least``: as :func:`parse_size`'s). An empty item
    ("16GiB,,32GiB", "16GiB,") is refused: a typo is never read as one card fewer."""
    parts = str(text).split(",")
    if not str(text).strip():
        raise UsageError(f"cannot read sizes {text!r}: write e.g. 16GiB,32GiB")
    if any(not p.strip() for p in parts):
        raise UsageError(f"cannot read sizes {text!r}: an empty size in the list; write e.g. 16GiB,32GiB")
    return [parse_size(p, at_least=at_least) for p in parts]


def _gib(n_bytes: int | float, digits: int = 2, sign: str = "", unit: str = " GiB") -> str:
    """``n_bytes`` in GiB with ``digits`` decimals (``sign`` "+": always signed) and ``unit`` after it; a figure
    too small for those decimals, in its own unit (see the module docstring)."""
    text = f"{n_bytes / GiB:{sign}.{digits}f}"
    if n_bytes and not float(text):  # not zero, yet it would read zero
        return ("+" if sign and n_bytes > 0 else "") + format_bytes(n_bytes, digits)
    return text + unit


def format_gib(n_bytes: int | float | None, digits: int = 2) -> str:
    """ "12.34 GiB" (GiB, for columns and plot labels that must compare at a glance; "9.24 KiB" for a figure too
    small for ``digits`` decimals of GiB); "—" for None."""
    return "—" if n_bytes is None else _gib(n_bytes, digits)


def gib_number(n_bytes: int | None) -> str:
    """ "12.34" (GiB, for table columns headed "GiB"; "9.24 KiB", with its unit, for a figure too small for
    two decimals of GiB); "-" for None."""
    return "-" if n_bytes is None else _gib(n_bytes, unit="")


def gib_or_dash(n_bytes: int | None) -> str:
    """ "12.34 GiB" as :func:`format_gib`, "-" for None (text reports' empty cell)."""
    return "-" if n_bytes is None else format_gib(n_bytes)


def signed_gib_number(n_bytes: int) -> str:
    """ "+0.12" (GiB, for delta columns headed "GiB"; "+9.24 KiB" for a figure too small for two decimals)."""
    return _gib(n_bytes, sign="+", unit="")


def signed_gib(n_bytes: int) -> str:
    """ "+0.12 GiB": a change in prose (:func:`signed_gib_number` with its unit)."""
    return _gib(n_bytes, sign="+")


def format_size(n_bytes: int | float | None) -> str:
    """A size as torch's OOM message writes it (c10's ``format_size``): two decimals of the largest unit the
    size is *more* than, so "27.56 MiB" rather than "0.03 GiB", and exactly 1 GiB reads "1024.00 MiB" as torch
    prints it; "—" for None."""
    if n_bytes is None:
        return "—"
    sign, n = ("-" if n_bytes < 0 else ""), abs(float(n_bytes))
    unit, scale = _size_unit(n)
    return f"{sign}{int(n)} B" if scale == 1 else f"{sign}{n / scale:.2f} {unit}"


def _size_unit(n: float) -> tuple[str, int]:
    """(name, bytes) of the largest unit ``n`` (>= 0) is *more* than, as c10's ``format_size`` picks it; B below."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n > scale:
            return unit, scale
    return "B", 1


def axis_unit(top_bytes: int | float) -> tuple[str, int]:
    """(name, bytes) of the unit a plot's y axis reads in, for data reaching ``top_bytes``: the largest unit it is
    more than, as :func:`format_size` words a size, so a CPU profiler trace's KiB-sized curves are drawn in KiB
    (never a flat line at "0.00 GiB") and a start-up of many GiB stays in GiB; GiB for nothing at all.
    ``plots/assets/view_units.js``'s ``axisUnit`` is its port."""
    n = abs(float(top_bytes))
    return _size_unit(n) if n else ("GiB", GiB)  # nothing drawn: the start-up's unit


def signed_size(n_bytes: int) -> str:
    """ "+1.53 GiB", "-4.25 MiB", "0 B": a change as :func:`format_size` words a size."""
    return ("+" if n_bytes > 0 else "") + format_size(n_bytes)


def format_bytes(n_bytes: int | float, digits: int = 1) -> str:
    """A human size in the largest binary unit that keeps the number >= 1: "512.0 MiB", "3.2 GiB"."""
    sign = "-" if n_bytes < 0 else ""
    n = abs(float(n_bytes))
    for unit, scale in (("TiB", 1024**4), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            return f"{sign}{n / scale:.{digits}f} {unit}"
    return f"{sign}{int(n)} B"


def count_of(n: int | None, noun: str, plural: str = "") -> str:
    """A count and its noun, as prose words it: "1 block", "13,587 blocks", "0 requests"; "- requests" for an
    unknown count. ``plural`` when it is not ``noun`` + "s" ("process", "processes")."""
    many = plural or f"{noun}s"
    if n is None or not isinstance(n, int | float):
        return f"- {many}"
    return f"{n:,} {noun if n == 1 else many}"


def thousands(n: int | float | None) -> str:
    """A count with thousands separators ("260,474"); "-" for an unknown one."""
    return "-" if n is None or not isinstance(n, int | float) else f"{n:,}"


@dataclass(frozen=True)
class SizeColumn:
    """The one unit of a table's size columns, named in their header: GiB wherever GiB can show the largest figure
    (every GPU start-up), else the largest unit that figure is more than (a CPU profiler trace's KiB). Each cell
    has two decimals of that unit; a figure too small for them reads "<0.01" ("+<0.01", "-<0.01" signed), never a
    size in another unit under the header, never zero when it is not."""

    unit: str
    scale: int

    def cell(self, n_bytes: int | None, signed: bool = False) -> str:
        """``n_bytes`` in the column's unit ("12.34", "+0.50", "<0.01"); "-" for None."""
        if n_bytes is None:
            return "-"
        if self.scale == 1:
            return f"{n_bytes:{'+' if signed else ''},}"
        text = f"{n_bytes / self.scale:{'+' if signed else ''}.2f}"
        if n_bytes and not float(text):
            return ("-" if n_bytes < 0 else "+" if signed else "") + "<0.01"
        return text


def size_column(values: Iterable[int | None]) -> SizeColumn:
    """The :class:`SizeColumn` of a table whose size cells are ``values`` (None: an empty cell)."""
    top = max((abs(v) for v in values if v is not None), default=0)
    if top == 0 or float(f"{top / GiB:.2f}"):
        return SizeColumn("GiB", GiB)
    return SizeColumn(*axis_unit(top))
