"""A vLLM start-up that vLLM itself ended (no CUDA OOM) is a verdict of its own: "did not finish".

Real data: vLLM 0.34.0 on the H200 with another process leaving 12.66 GiB free (`tests/data/vllm-h200-034-grid`):
`small-r2048` got through warm-up, then vLLM's extensible KV cache found 0 blocks and raised ValueError ("No
available memory for the cache blocks"); the process exited. Before this verdict every output called that
run "within target". `g08`, the same flags on the whole card, completed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from memtrace import facts as F
from memtrace.cli import main
from memtrace.plugins import vllm_phases
from memtrace.plugins.surface import of_role

DATA = Path(__file__).resolve().parents[1] / "data"
GRID = DATA / "vllm-h200-034-grid"
CUT = DATA / "vllm-h100-034-archs" / "cut-gemma3-0"  # H100, vLLM 0.34.0, format 1.6: refused in the engine


def _json(capsys, run: Path) -> dict:
    assert main(["report", "--json", str(run)]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_startup_vllm_refused_after_warm_up_did_not_finish(capsys):
    doc = _json(capsys, GRID / "small-r2048")
    assert doc["verdict"] == "did not finish"
    assert main(["report", str(GRID / "small-r2048")]) == 0
    first = capsys.readouterr().out.split("\n\n")[0].replace("\n", " ")
    assert first.startswith("DID NOT FINISH: the process's start-up ended at 204.62 s (the process exited)")
    assert "in compile_or_warm_up/kv_cache_sizing, without a CUDA OOM" in first


def test_the_same_flags_on_the_whole_card_completed_and_an_oom_is_still_died(capsys):
    assert _json(capsys, GRID / "g08")["verdict"] == "within target"
    assert _json(capsys, GRID / "small-d16384")["verdict"] == "died"


def test_the_issue_bundle_of_an_unfinished_startup_says_so_first(capsys, tmp_path):
    main(["issue", str(GRID / "small-r2048"), "-o", str(tmp_path / "b")])
    capsys.readouterr()
    text = (tmp_path / "b" / "issue.md").read_text()
    assert "DID NOT FINISH" in text.split("\n\n")[0] or "DID NOT FINISH" in text[:600]
    assert "stayed under the target" not in text


class _Session:
    """Stands in for the capture session (its facts and the phase it closes): a fake, since the plugin's
    phase hooks run only inside a real vLLM worker."""

    def __init__(self):
        self.facts: dict = {}

    def set_fact(self, key, value):
        self.facts[key] = value

    def phase_exit(self, index):
        pass


def _left(phase: str, error: BaseException, s: _Session) -> None:
    """``error`` leaves the vLLM method behind ``phase``: the plugin's phase hook sees it go by."""
    entry = next(e for e in of_role("phase") if e.phase == phase)
    vllm_phases.PhaseHook(None, entry).after((0, None, s), None, error)


def test_the_plugin_keeps_the_first_error_that_left_a_phase_and_not_an_oom():
    s = _Session()

    class OutOfMemoryError(RuntimeError):
        pass

    _left("kv_cache_sizing", OutOfMemoryError("CUDA out of memory"), s)
    assert F.VLLM_STARTUP_ERROR not in s.facts
    _left("kv_cache_sizing", ValueError("No available memory for the cache blocks.\nmore"), s)
    _left("compile_or_warm_up", ValueError("outer"), s)
    assert s.facts[F.VLLM_STARTUP_ERROR] == {
        "phase": "kv_cache_sizing",
        "type": "ValueError",
        "message": "No available memory for the cache blocks.",
    }


def _headline(run: Path, format_version: tuple[int, int] | None = None) -> str:
    from memtrace.analysis.analysed.run import analyse
    from memtrace.plots.verdict_text import headline
    from memtrace.store import load_run

    traces = load_run(run).traces
    if format_version is not None:
        traces = [dataclasses.replace(t, format_version=format_version) for t in traces]
    return headline(analyse(traces))


NOT_SEEN = (
    "DID NOT FINISH: the process's start-up ended at 15.13 s (the process exited) in compile_or_warm_up/"
    "kv_cache_sizing, without a CUDA OOM: {why}. Nothing after it was recorded; no KV cache was sized to judge."
)


def test_an_error_a_current_plugin_did_not_see_is_not_blamed_on_an_old_trace():
    """cut-gemma3-0: vLLM 0.34 raised in ``finalize_extensible_kv_cache`` (its log), after every hooked phase of the
    worker returned; the plugin that recorded it keeps errors (format 1.6), it did not see this one."""
    assert _headline(CUT) == NOT_SEEN.format(
        why="the plugin did not see the error (vLLM raised it outside the phases memtrace hooks): vLLM's log says why"
    )


def test_only_a_format_from_before_the_error_fact_says_the_trace_predates_it():
    """Format 1.2 and before: no plugin kept errors. 1.3 was written before and after it came (2026-12-04):
    a wording true either way (small-r2048 is one such 1.3 trace)."""
    assert _headline(CUT, (1, 2)) == NOT_SEEN.format(
        why="vLLM's log says why (this trace predates the plugin keeping the error)"
    )
    assert _headline(CUT, (1, 3)) == NOT_SEEN.format(why="memtrace did not see the error: vLLM's log says why")
    small = _headline(GRID / "small-r2048")
    assert "without a CUDA OOM: memtrace did not see the error: vLLM's log says why." in small.replace("\n", " ")
