"""pytest plugin: fail a test whose GPU memory peak goes over a budget.

Loaded through the ``pytest11`` entry point (name ``memtrace``); loading it imports neither torch
nor numpy: only a test that asks for a budget does. Two ways to ask::

    @pytest.mark.memtrace(max_peak="30GiB")          # the whole test (call phase)
    def test_startup(): ...

    @pytest.mark.memtrace(max_peak="2GiB", curve="allocated")
    def test_forward(): ...

    @pytest.mark.memtrace(util=0.5)                   # half the card (util x the card, or x total=)
    def test_half(): ...

    def test_prefill(memtrace_budget):                # one block of a test
        with memtrace_budget("2GiB"):
            model(tokens)

The test is recorded with memtrace's capture API (after ``gc.collect()`` and
``torch.cuda.empty_cache()``, so that memory cached by earlier tests does not count) inside a phase
named after the test; user phases (``memtrace.phase``) nest in it. ``curve`` is "reserved" (the
default: PyTorch's segments), "allocated" or "device" (NVML, the whole card). Over budget, the test
fails with the budget, the measured peak, the phase of the peak, every curve's peak and the OOM as
``memtrace report`` gives them (``analysis.budget`` resolves the budget through
``analysis.target.resolve_target`` and takes its figures from ``analysis.analysed.rank.AnalysedRank``), the top
holders and the trace's path. A budgeted test that raised after a CUDA OOM gets a "memtrace"
section in its report: where it died, what it asked for, what was free. Without torch or a CUDA GPU the test is *skipped* with
the reason, never passed silently. ``--memtrace-dir DIR`` keeps the traces there (default: a
temporary directory).
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

MARKER = "memtrace"


@dataclass(frozen=True)
class Budget:
    """What a test asked for: the largest peak allowed on one curve."""

    max_peak_bytes: int | None  # None: the budget is util x the card (``util=``)
    max_peak_text: str
    curve: str = "reserved"
    util: float | None = None
    total_bytes: int | None = None


_BUDGET_KEY = pytest.StashKey[Budget]()
_ACTIVE_KEY = pytest.StashKey[tuple]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memtrace", "GPU memory budgets (memtrace)")
    group.addoption("--memtrace-dir", default=None, help="keep the traces of budgeted tests in this directory")


def pytest_configure(config: pytest.Config) -> None:
    # two plain hook objects around pytest's own call hook rather than one wrapper: works with every
    # pluggy that pytest >= 7 accepts (``wrapper=True`` needs pluggy >= 1.2)
    if not config.pluginmanager.has_plugin("memtrace-budget-start"):
        config.pluginmanager.register(_StartRecording(), "memtrace-budget-start")
        config.pluginmanager.register(_CheckBudget(), "memtrace-budget-check")
    config.addinivalue_line(
        "markers",
        "memtrace(max_peak, curve='reserved', util=None, total=None): fail the test when its GPU memory "
        "peak exceeds max_peak (e.g. '30GiB') or util x the card; skipped without a CUDA GPU",
    )


def _curves() -> tuple[str, ...]:
    return ("reserved", "allocated", "device")  # memtrace.analysis.gate.budget.CURVES, without importing numpy


def parse_budget(
    max_peak: Any = None, curve: str = "reserved", *, util: Any = None, total: Any = None, **unknown: Any
) -> Budget:
    """A Budget from the marker's or fixture's arguments; UsageError (one line) when unreadable.

    ``max_peak`` is a size ("30GiB"); ``util`` a share of the card (0.9 or "90%") times ``total``
    or the card the test ran on: the same target resolution as ``memtrace report --util``.
    """
    from memtrace.errors import UsageError
    from memtrace.units import parse_fraction, parse_size

    if unknown:
        raise UsageError(
            f"memtrace budget: unknown argument(s) {', '.join(sorted(unknown))}; use max_peak= or util=, and curve="
        )
    if max_peak is None and util is None:
        raise UsageError("memtrace budget: give max_peak, e.g. @pytest.mark.memtrace(max_peak='30GiB'), or util=0.9")
    if max_peak is not None and util is not None:
        raise UsageError("memtrace budget: give either max_peak or util, not both")
    if total is not None and util is None:
        raise UsageError("memtrace budget: total= only applies with util=")
    if curve not in _curves():
        raise UsageError(f"memtrace budget: unknown curve {curve!r}; use one of {', '.join(_curves())}")
    if util is not None:
        u = parse_fraction(util)
        return Budget(None, f"util {u:g}", curve, u, parse_size(total) if total is not None else None)
    return Budget(parse_size(max_peak), str(max_peak), curve)


def cuda_unavailable_reason() -> str | None:
    """Why a budget cannot be measured here (no torch, no CUDA GPU), or None when it can."""
    try:
        import torch
    except ImportError:
        return "memtrace budget needs torch with CUDA; torch is not installed"
    if not torch.cuda.is_available():
        return f"memtrace budget needs a CUDA GPU; torch {torch.__version__} sees none"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return
    from memtrace.errors import MemtraceError

    try:
        budget = parse_budget(*marker.args, **marker.kwargs)
    except MemtraceError as exc:
        pytest.fail(str(exc), pytrace=False)
    reason = cuda_unavailable_reason()
    if reason:
        pytest.skip(reason)
    item.stash[_BUDGET_KEY] = budget


class _StartRecording:
    """Starts recording right before the test function runs (before pytest's own call hook)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        if item.stash.get(_BUDGET_KEY, None) is None:
            return
        recording = _record(item.config, item.nodeid, item.name)
        item.stash[_ACTIVE_KEY] = (recording, recording.__enter__())


class _CheckBudget:
    """Stops recording once the test function returned, and fails the test over budget. A test that
    raised never gets here (its own failure stands); teardown stops its recording."""

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        holder = _stop(item)
        if holder is not None:
            _enforce(item.stash[_BUDGET_KEY], holder["path"], item.nodeid)


def _stop(item: pytest.Item) -> dict[str, Path] | None:
    active = item.stash.get(_ACTIVE_KEY, None)
    if active is None:
        return None
    del item.stash[_ACTIVE_KEY]
    recording, holder = active
    recording.__exit__(None, None, None)
    return holder


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    _stop(item)


@contextlib.contextmanager
def _record(config: pytest.Config, nodeid: str, phase_name: str) -> Iterator[dict[str, Path]]:
    """Record the body with memtrace's capture API; the trace's path lands in the yielded dict."""
    import gc

    import torch
    from memtrace.capture import api

    gc.collect()
    torch.cuda.empty_cache()
    directory = config.getoption("memtrace_dir", None)
    base = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="memtrace-pytest-"))
    base.mkdir(parents=True, exist_ok=True)
    path = base / (re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[-150:] + ".memtrace")
    if path.exists():
        path.unlink()
    holder: dict[str, Path] = {"path": path}
    session = api.start(path, role="test", handle_signals=False)
    try:
        with api.phase(phase_name, source="user"):
            yield holder
    finally:
        torch.cuda.synchronize()
        holder["path"] = session.close("test-end") or path


def _enforce(budget: Budget, path: Path, what: str) -> None:
    from memtrace.analysis.gate.budget import check_budget
    from memtrace.errors import NothingToJudge
    from memtrace.store import load_trace

    try:
        result = check_budget(
            load_trace(path),
            budget.max_peak_bytes,
            curve=budget.curve,
            util=budget.util,
            total_bytes=budget.total_bytes,
        )
    except NothingToJudge as exc:  # a test whose recording saw no GPU memory never passes its budget
        pytest.fail(f"{what}: {exc}", pytrace=False)
    if result.over:
        pytest.fail(failure_message(result, what, budget.max_peak_text, path), pytrace=False)


def failure_message(result: Any, what: str, budget_text: str, path: Path | str | None = None) -> str:
    """The readable failure of an over-budget test: budget, measured peak, phase, top holders, the
    peaks and the OOM as ``memtrace report`` gives them."""

    from memtrace.units import format_gib as gib

    source = f", {result.budget_source}" if getattr(result, "budget_source", "") not in ("", "--target") else ""
    lines = [
        f"{what}: GPU memory peak {gib(result.peak_bytes)} ({result.curve}) is over the budget "
        f"{budget_text} ({gib(result.budget_bytes)}{source}) by {gib(result.excess_bytes)}",
        f"  peak in phase: {result.phase or 'outside any phase'}",
    ]
    return "\n".join(lines + _details(result, path))


def _details(result: Any, path: Path | str | None) -> list[str]:
    from memtrace.units import format_gib as gib

    lines = []
    if result.peaks:
        lines.append("  peaks (as memtrace report): " + ", ".join(f"{k} {gib(v)}" for k, v in result.peaks.items()))
    if result.oom is not None:
        o = result.oom
        free = f" with {gib(o.free_bytes)} free" if o.free_bytes is not None else ""
        lines.append(f"  died of CUDA OOM in {o.phase_path or 'no phase'}: asked for {gib(o.requested_bytes)}{free}")
    if result.holders:
        lines.append("  top holders at the peak:")
        for h in result.holders:
            f = h.frame
            where = f"{f.name} ({'/'.join(f.filename.split('/')[-2:])}:{f.line})" if f else "(no stack recorded)"
            lines.append(f"    {gib(h.bytes):>10}  {h.count:>5} block(s)  {where}")
    if path is not None:
        lines.append(f"  trace: {path}  (memtrace report {path})")
    return lines


def oom_report(path: Path | str) -> str | None:
    """For a test that raised: what memtrace saw if the trace recorded a CUDA OOM, else None."""
    from memtrace.analysis.gate.budget import check_budget
    from memtrace.analysis.memory.oom import find_oom
    from memtrace.store import load_trace

    trace = load_trace(path)
    if find_oom(trace) is None:
        return None
    result = check_budget(trace, 1 << 62)  # any budget: only the figures are wanted
    head = f"GPU memory peak {_gib(result.peak_bytes)} (reserved) in {result.phase or 'no phase'}"
    return "\n".join([head, *_details(result, path)])


def _gib(n: int) -> str:
    from memtrace.units import format_gib

    return format_gib(n)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """A budgeted test that raised (a CUDA OOM, typically): stop its recording and add what it saw."""
    outcome = yield
    if call.when != "call" or call.excinfo is None:
        return
    holder = _stop(item)
    if holder is None:
        return
    try:
        text = oom_report(holder["path"])
    except Exception as exc:  # the test's own failure stands; say why memtrace has nothing to add
        text = f"memtrace could not read the test's trace {holder['path']}: {exc}"
    if text:
        outcome.get_result().sections.append(("memtrace", text))


class BudgetRecorder:
    """The ``memtrace_budget`` fixture's value: ``with memtrace_budget("2GiB"): ...``."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self.checks: list[Any] = []

    @contextlib.contextmanager
    def __call__(self, max_peak: Any, curve: str = "reserved") -> Iterator[None]:
        from memtrace.errors import MemtraceError

        try:
            budget = parse_budget(max_peak, curve)
        except MemtraceError as exc:
            pytest.fail(str(exc), pytrace=False)
        node = self._request.node
        with _record(node.config, f"{node.nodeid}-block{len(self.checks) + 1}", node.name) as holder:
            yield
        self.checks.append(budget)
        _enforce(budget, holder["path"], node.nodeid)


@pytest.fixture
def memtrace_budget(request: pytest.FixtureRequest) -> BudgetRecorder:
    """Record a block and fail the test when its GPU memory peak goes over a budget (skips without CUDA)."""
    reason = cuda_unavailable_reason()
    if reason:
        pytest.skip(reason)
    return BudgetRecorder(request)
