"""Where the real traces recorded on the H200 live, for tests that run over all of them."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"


def real_traces() -> list[Path]:
    """Every real .memtrace file shipped under tests/data, in a stable order."""
    return sorted(DATA.glob("**/*.memtrace"))
