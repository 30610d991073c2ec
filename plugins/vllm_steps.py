"""vLLM's scheduler steps as facts of the serving window (``MEMTRACE_UNTIL=serving`` only).

:class:`StepHook` wraps ``Worker.execute_model(scheduler_output)`` (the entry ``serving-step`` of
:mod:`.surface`, installed only in serving mode) and hands each step to the session's ring: when it began,
how long it took, how many requests and tokens vLLM scheduled (read from the ``SchedulerOutput`` it was
given: ``num_scheduled_tokens``, ``total_num_scheduled_tokens``; nothing is called on it), and the error
that left it (a CUDA OOM). The step is handed over when it begins too (in progress until it ends), so that a
window written during it (the OOM observer's, inside the step that failed) names it. The call, its arguments
and its result pass through untouched.
"""

from __future__ import annotations

from typing import Any

from memtrace.capture.clock import now_us
from memtrace.plugins.hooks import Target
from memtrace.plugins.vllm_phases import session


def step_facts(scheduler_output: Any) -> dict[str, Any]:
    """Requests and tokens of one scheduler step, as the ``SchedulerOutput`` holds them (absent: omitted)."""
    out: dict[str, Any] = {}
    per_request = getattr(scheduler_output, "num_scheduled_tokens", None)
    if isinstance(per_request, dict):
        out["requests"] = len(per_request)
        out["max_request_tokens"] = max(per_request.values(), default=0)
    total = getattr(scheduler_output, "total_num_scheduled_tokens", None)
    if isinstance(total, int):
        out["tokens"] = total
    finished = getattr(scheduler_output, "finished_req_ids", None)
    if isinstance(finished, (set, frozenset, list, tuple)):
        out["finished"] = len(finished)
    return out


class StepHook:
    """A hooks.Handler around ``Worker.execute_model``: one step record per call, in serving mode."""

    key = "vllm.serving_step"
    cost_source = "serving_steps"

    def __init__(self, plugin: Any = None, entry: Any = None):
        pass

    def before(self, target: Target, args: tuple, kwargs: dict) -> Any:
        current = session()
        if current is None or getattr(current, "serving", None) is None:
            return None
        # (self, scheduler_output): positional in every listed vLLM; inspect.signature per step would cost more
        output = args[1] if len(args) > 1 else kwargs.get("scheduler_output")
        start_us, facts = now_us(), step_facts(output)
        return (current, start_us, facts, current.begin_step({"time_us": start_us, **facts}))

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if token is None:
            return
        current, start_us, step, began = token
        step = {"time_us": start_us, "duration_us": now_us() - start_us, **step}
        if error is not None:
            step["error"] = type(error).__name__
        current.record_step(step, began)
