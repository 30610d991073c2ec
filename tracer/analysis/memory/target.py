"""The line not to cross and the card it is drawn on: one resolver, one precedence, for every output.

Every command, renderer, exporter and the pytest gate asks :func:`resolve_target` and shows what it
returns. Precedence:

1. an explicit target in bytes (``--target``);
2. ``ceil(util x total)`` for an explicit utilization (``--util``) times ``--total`` when given, else
   the card the run stood for (see :func:`card_capacity`);
3. the target the trace recorded (vLLM's ``requested_memory``, ``facts["target_bytes"]``);
4. ``ceil(recorded util x card)``;
5. none.

The card's capacity is ``--total`` when given, else ``facts["capacity_bytes"]`` (a run that stood
for a smaller card, e.g. under ``set_per_process_memory_fraction``), else the device's physical memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memtrace import facts as F
from memtrace.errors import UsageError
from memtrace.model import Trace

#: Where a target came from, in the words reports print.
ARGUMENT = "--target"
UTIL_TOTAL = "--util x --total"
UTIL_CARD = "--util x card"
RECORDED = "recorded"
RECORDED_UTIL = "recorded util x card"


@dataclass(frozen=True)
class Target:
    """The target and the card, in bytes; ``target_bytes`` is None when nothing gives one."""

    target_bytes: int | None
    capacity_bytes: int | None  # the card: --total, the card the run stood for, else the device
    util: float | None  # the utilization behind the target, when it came from one
    source: str  # ARGUMENT, UTIL_TOTAL, UTIL_CARD, RECORDED, RECORDED_UTIL or ""
    capacity_source: str  # "--total", "recorded card", "device", ""
    #: for a recorded target, who chose the utilization: "user", "vllm-default" or "" (facts.UTIL_SOURCE)
    util_source: str = ""
    #: how vLLM sized the KV cache: one of facts.KV_SIZED_* / KV_SIZE_GIVEN_* (facts.VLLM_KV_SIZE_SOURCE), or ""
    #: when not recorded; it picks vLLM's default utilization
    kv_sizing: str = ""


def card_capacity(trace: Trace) -> tuple[int | None, str]:
    """The card's memory and where it came from: the card the run stood for, else the device's."""
    stood_for = F.int_fact(trace.facts, F.CAPACITY_BYTES)
    if stood_for is not None and stood_for > 0:
        return stood_for, "recorded card"
    if trace.process.device_total_bytes:
        return int(trace.process.device_total_bytes), "device"
    return None, ""


def resolve_target(
    trace: Trace,
    *,
    target_bytes: int | None = None,
    util: float | None = None,
    total_bytes: int | None = None,
) -> Target:
    """The target for ``trace`` (see the module docstring for the precedence).

    Args:
        trace: the trace.
        target_bytes: an explicit target (``--target``); must be above zero.
        util: an explicit utilization (``--util``), in (0, 1].
        total_bytes: the card's memory for ``util`` (``--total``); only with ``util``.
    Raises:
        UsageError: for a target of 0 bytes, ``target_bytes`` together with ``util``, ``total_bytes``
            without ``util``, or ``util`` on a trace that recorded no capacity and no ``total_bytes``.
    """
    if target_bytes is not None and util is not None:
        raise UsageError("give either --target or --util, not both")
    if total_bytes is not None and util is None:
        raise UsageError("--total only applies with --util; pass --util 0.92 --total 96GB, or --target BYTES")
    if target_bytes is not None and target_bytes <= 0:
        raise UsageError(f"--target {target_bytes} B is not a line a start-up can stay under; give a size above 0")
    if total_bytes is not None and total_bytes <= 0:
        raise UsageError("--total must be above 0 bytes")
    card, card_source = (total_bytes, "--total") if total_bytes is not None else card_capacity(trace)
    if target_bytes is not None:
        return Target(int(target_bytes), card, None, ARGUMENT, card_source)
    if util is not None:
        if not card:
            raise UsageError(f"{trace.label} does not record its device capacity; pass --total BYTES with --util")
        return Target(math.ceil(util * card), card, util, UTIL_TOTAL if total_bytes is not None else UTIL_CARD,
                      card_source)  # fmt: skip
    recorded_util = trace.facts.get(F.UTIL)
    recorded_util = float(recorded_util) if isinstance(recorded_util, (int, float)) else None
    recorded = F.int_fact(trace.facts, F.TARGET_BYTES)
    how = {
        k: str(trace.facts.get(fact) or "")
        for k, fact in (("util_source", F.UTIL_SOURCE), ("kv_sizing", F.VLLM_KV_SIZE_SOURCE))
    }
    if recorded is not None and recorded > 0:
        return Target(recorded, card, recorded_util, RECORDED, card_source, **how)
    if recorded_util and card:
        return Target(math.ceil(recorded_util * card), card, recorded_util, RECORDED_UTIL, card_source, **how)
    return Target(None, card, recorded_util, "", card_source, **how)


def describe(target: Target) -> str:
    """One phrase for reports: where the target came from."""
    if target.source == ARGUMENT:
        return "--target"
    if target.source in (UTIL_TOTAL, UTIL_CARD):
        return f"--util {target.util:g} x {'--total' if target.source == UTIL_TOTAL else 'the card'}"
    if target.source == RECORDED:
        return (
            "vLLM's requested memory, as recorded"
            if target.util is None
            else f"the recorded --gpu-memory-utilization {target.util:g}{_chosen(target)}"
        )
    if target.source == RECORDED_UTIL:
        return f"recorded util {target.util:g} x the card{_chosen(target)}"
    return "none"


#: vLLM's sizing modes in words (facts.VLLM_KV_SIZE_SOURCE)
KV_SIZING_WORDS = {
    F.KV_SIZED_EXTENSIBLE: "the extensible KV cache, sized after warm-up",
    F.KV_SIZED_BY_PROFILING: "the KV cache sized by profiling",
    F.KV_SIZE_GIVEN_FLAG: "the KV cache's size given (--kv-cache-memory-bytes)",
    F.KV_SIZE_GIVEN_PLAN: "the KV cache's size from a start-up plan (VLLM_ENABLE_STARTUP_PLAN)",
}


def _chosen(target: Target) -> str:
    """Who chose the recorded utilization: ", set by the user" or ", vLLM's default for <sizing mode>"."""
    if target.util_source == F.UTIL_BY_USER:
        return ", set by the user"
    if target.util_source == F.UTIL_VLLM_DEFAULT:
        mode = KV_SIZING_WORDS.get(target.kv_sizing)
        return ", vLLM's default" + (f" with {mode}" if mode else "")
    return ""
