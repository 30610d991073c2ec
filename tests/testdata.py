"""Where the real traces recorded on the H200 live, for tests that run over all of them."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"


def real_traces() -> list[Path]:
    """Every real .memtrace file shipped under tests/data, in a stable order."""
    return sorted(DATA.glob("**/*.memtrace"))


def analysed_rank(trace, **spec):
    """The analysed rank of one trace (``analysis.run.analyse`` of a one-trace run) under a target
    specification (``target_bytes``, ``util``, ``total_bytes``): what every output renders."""
    from memtrace.analysis.rank import TargetSpec
    from memtrace.analysis.run import analyse

    return analyse([trace], TargetSpec(**spec), path=trace.path).ranks[0]


def analysed_run(traces, **spec):
    """The analysed run of ``traces`` (one run) under a target specification."""
    from memtrace.analysis.rank import TargetSpec
    from memtrace.analysis.run import analyse

    return analyse(list(traces), TargetSpec(**spec), path=traces[0].path if traces else "")
