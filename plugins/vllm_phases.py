"""What the plugin does at each vLLM start-up phase: one handler class per phase, plus the read hooks.

Each class is a ``hooks.Handler`` named by an entry of :mod:`.surface` (the table says which vLLM
function it wraps and in which releases); :class:`PhaseHook` marks the phase around the call and the
subclasses add that phase's facts (``before_phase`` / ``after_phase``). The canonical phase names live
in :mod:`memtrace.vllm_phase_names`, below every layer, so the table, every handler and the analysis
spell them once.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.capture.clock import now_us
from memtrace.plugins import vllm_boundaries, vllm_facts
from memtrace.plugins.hooks import Target, call_argument

log = logging.getLogger("memtrace")


def session() -> Any:
    """The recording session of this process, or None (memtrace.capture not loaded or not recording)."""
    mod = sys.modules.get("memtrace.capture.api")
    return mod.current_session() if mod is not None else None


class PhaseHook:
    """A hooks.Handler marking one canonical phase around a vLLM method; subclasses add its facts.

    ``entry`` is the :class:`.surface.Entry` (its ``phase`` and ``skip_kwarg``); ``plugin`` the per-process
    ``vllm.Plugin``."""

    def __init__(self, plugin: Any, entry: Any):
        self.plugin = plugin
        self.target = entry
        self.phase = entry.phase
        self.key = entry.phase  # one phase at a time: a subclass calling its base is not nested
        self.cost_source = "phases"  # where hooks.py charges this hook's time

    def before(self, target: Target, args: tuple, kwargs: dict) -> Any:
        if self.target.skip_kwarg and call_argument(target, self.target.skip_kwarg, args, kwargs):
            return None
        worker = args[0] if args else None
        current = session()
        if current is None:
            return None
        self.before_phase(current, worker, target, args, kwargs)
        index = current.phase_enter(self.phase, source="vllm")
        vllm_boundaries.record(current, self.phase, "start")
        return (index, worker, current)

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if token is None:
            return
        index, worker, current = token
        vllm_boundaries.record(current, self.phase, "end")
        current.phase_exit(index)
        if error is not None:
            _log_oom(self.phase, error, current)
            _record_error(self.phase, error, current)
            return
        self.after_phase(current, worker, result)

    def before_phase(self, current: Any, worker: Any, target: Target, args: tuple, kwargs: dict) -> None:
        """Facts to take as the phase begins (none by default)."""

    def after_phase(self, current: Any, worker: Any, result: Any) -> None:
        """Facts to take when the phase returned normally (none by default)."""


class InitDevice(PhaseHook):
    """``init_device``: recording starts where it returns (the process owns a device now). As it begins, memtrace's
    capture code is imported on a thread of memtrace's own (:meth:`.vllm.Plugin.preimport`): vLLM's device set-up runs
    meanwhile, and the session's start finds the modules imported."""

    def before(self, target: Target, args: tuple, kwargs: dict) -> Any:
        self.plugin.preimport()
        return (None, args[0] if args else None, now_us())

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if token is not None and error is None:
            _, worker, start_us = token
            self.plugin.start_session(worker, start_us)


class LoadModel(PhaseHook):
    """``load_model``: the weights' bytes as vLLM counted them."""

    def after_phase(self, current: Any, worker: Any, result: Any) -> None:
        weights = getattr(getattr(worker, "model_runner", None), "model_memory_usage", None)
        if isinstance(weights, (int, float)):
            current.set_fact(F.VLLM_WEIGHTS_BYTES, int(weights))


class DetermineAvailableMemory(PhaseHook):
    """``determine_available_memory``: vLLM's available-KV figure, how it was sized, its profile and target."""

    kv_bytes_given: Any = None  # --kv-cache-memory-bytes as the call began

    def before_phase(self, current: Any, worker: Any, target: Target, args: tuple, kwargs: dict) -> None:
        self.kv_bytes_given = vllm_facts.kv_bytes_given(worker)

    def after_phase(self, current: Any, worker: Any, result: Any) -> None:
        if isinstance(result, int):
            current.set_fact(F.VLLM_AVAILABLE_KV_BYTES, int(result))
        current.set_fact(F.VLLM_KV_SIZE_SOURCE, vllm_facts.kv_size_source(self.kv_bytes_given, worker))
        current.set_fact(F.VLLM_PROFILE, vllm_facts.profile_facts(worker))
        # the target vLLM sizes with (0.34 resolves it again if the extensible KV cache was turned off)
        for key, value in vllm_facts.target_facts(worker).items():
            current.set_fact(key, value)
        current.set_fact(F.UTIL_SOURCE, vllm_facts.util_source(worker, self.plugin.version, self.plugin.argv()))


class KvCacheInit(PhaseHook):
    """``kv_cache_init``: the KV cache's configuration (blocks, tokens) as it is allocated. An extensible KV
    cache (vLLM 0.34) only reserves its address range here (the configuration's blocks are that range's
    capacity): its blocks are what ``kv_cache_sizing`` returns (:class:`KvCacheSizing`)."""

    def before_phase(self, current: Any, worker: Any, target: Target, args: tuple, kwargs: dict) -> None:
        if len(args) > 1 and not vllm_facts.extensible(worker):
            for key, value in vllm_facts.kv_cache_facts(args[1], worker).items():
                current.set_fact(key, value)


class CudagraphProfile(PhaseHook):
    """``cudagraph_profile``: vLLM's estimate of the CUDA graphs' memory."""

    def after_phase(self, current: Any, worker: Any, result: Any) -> None:
        if isinstance(result, int):
            current.set_fact(F.VLLM_GRAPH_ESTIMATE_BYTES, int(result))


class KvCacheSizing(PhaseHook):
    """``kv_cache_sizing`` (0.34, ``measure_kv_cache_blocks(kv_cache, ...)``): the inputs and result of
    vLLM's post-warm-up sizing; the blocks it returns are the KV cache's (0: vLLM refuses to start)."""

    def before_phase(self, current: Any, worker: Any, target: Target, args: tuple, kwargs: dict) -> None:
        current.set_fact(  # args[0] is the ExtensibleKVCache here
            F.VLLM_KV_SIZING,
            vllm_facts.sizing_inputs(
                worker,
                call_argument(target, "init_free_memory", args, kwargs),
                call_argument(target, "requested_memory", args, kwargs),
            ),
        )

    def after_phase(self, current: Any, worker: Any, result: Any) -> None:
        sizing = dict(current.facts.get(F.VLLM_KV_SIZING) or {})
        limit = getattr(worker, "torch_memory_limit", None)
        if isinstance(limit, int):
            sizing["torch_memory_limit_bytes"] = limit
        sizing["time_us"] = now_us()
        if isinstance(result, int) and not isinstance(result, bool):
            sizing["num_blocks"] = int(result)
            for key, value in F.sized_kv_facts(int(result), sizing.get("committed_bytes")).items():
                current.set_fact(key, value)
        current.set_fact(F.VLLM_KV_SIZING, sizing)


class KvCacheExtend(PhaseHook):
    """``kv_cache_extend`` (0.34): the KV cache reaches its final size; start-up is complete."""

    def after_phase(self, current: Any, worker: Any, result: Any) -> None:
        self.plugin.kv_cache_extended(current, worker)


class CompileOrWarmUp(PhaseHook):
    """``compile_or_warm_up``: the end of start-up, unless an extensible KV cache is extended next."""

    def after_phase(self, current: Any, worker: Any, result: Any) -> None:
        if vllm_facts.extensible(worker) and self.plugin.extends_kv_cache:
            return  # the KV cache is committed to its final size next (kv_cache_extend): start-up ends there
        tokens = vllm_facts.kv_cache_facts(None, worker).get(F.VLLM_KV_TOKENS)
        if tokens is not None and F.VLLM_KV_TOKENS not in current.facts:
            current.set_fact(F.VLLM_KV_TOKENS, tokens)
        self.plugin.startup_complete(current)


class PeakResetHook:
    """Appends the time of each reset of torch's peak counters to ``memtrace.peak_resets_us``."""

    key = "torch.reset_peak_memory_stats"  # one key: torch.accelerator's reset calling torch.cuda's counts once
    cost_source = "sizing_reads"

    def __init__(self, plugin: Any = None, entry: Any = None):
        pass

    def before(self, target: Target, args: tuple, kwargs: dict) -> Any:
        return session()

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if token is not None and error is None:
            token.set_fact(F.PEAK_RESETS_US, [*(token.facts.get(F.PEAK_RESETS_US) or []), now_us()])


class TransientPeakHook:
    """Appends what each ``record_transient_peak`` read to ``vllm.transient_peaks``: torch's allocated and
    reserved counters (current and peak since the last reset) and the reserve it left on the KV cache."""

    key = "vllm.transient_peak"
    cost_source = "sizing_reads"

    def __init__(self, plugin: Any = None, entry: Any = None):
        pass

    def before(self, target: Target, args: tuple, kwargs: dict) -> Any:
        current = session()
        return None if current is None or not args else (current, args[0])

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if token is None or error is not None or not hasattr(result, "get"):
            return
        current, kv_cache = token
        item = {"time_us": now_us()}
        for key, stat in (
            ("allocated_bytes", "allocated_bytes.all.current"),
            ("allocated_peak_bytes", "allocated_bytes.all.peak"),
            ("reserved_bytes", "reserved_bytes.all.current"),
            ("reserved_peak_bytes", "reserved_bytes.all.peak"),
        ):
            value = result.get(stat)
            if isinstance(value, int):
                item[key] = value
        for key, attr in (
            ("reserved_headroom_bytes", "reserved_headroom_bytes"),
            ("torch_reserve_growth_bytes", "torch_reserve_growth_bytes"),
        ):
            value = getattr(kv_cache, attr, None)
            if isinstance(value, int):
                item[key] = value
        current.set_fact(F.VLLM_TRANSIENT_PEAKS, [*(current.facts.get(F.VLLM_TRANSIENT_PEAKS) or []), item])


class SizingReadHook:
    """Keeps vLLM's first ``device_memory_info`` reading inside ``kv_cache_sizing`` in ``vllm.kv_cache_sizing``
    (taken after its ``empty_cache``: the ``free_memory`` the KV cache is sized from)."""

    key = "vllm.sizing_read"
    cost_source = "sizing_reads"

    def __init__(self, plugin: Any = None, entry: Any = None):
        pass

    def before(self, target: Target, args: tuple, kwargs: dict) -> Any:
        current = session()
        if current is None or not current.phase_path().endswith(PN.KV_CACHE_SIZING):
            return None
        sizing = current.facts.get(F.VLLM_KV_SIZING) or {}
        return None if "free_memory_bytes" in sizing else current

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if token is None or error is not None or not isinstance(result, tuple) or len(result) != 2:
            return
        free, total = result
        if isinstance(free, int) and isinstance(total, int):
            sizing = dict(token.facts.get(F.VLLM_KV_SIZING) or {})
            sizing.update(free_memory_bytes=free, total_memory_bytes=total, free_read_us=now_us())
            token.set_fact(F.VLLM_KV_SIZING, sizing)


class EngineErrorHook:
    """Keeps an error vLLM's engine raises outside the worker's phases, as a phase's would be (``_record_error``):
    0.34's ``finalize_extensible_kv_cache`` (``EngineCore._initialize_kv_caches``, after ``compile_or_warm_up``
    returned) refuses there when the measured KV cache holds no block ("No available memory for the cache
    blocks"). Records nothing when the call returns; vLLM's error goes on untouched. ``entry.phase``: the phase
    the error is kept under. Only a process that records sees it (the worker's own under the uni executor)."""

    cost_source = "phases"

    def __init__(self, plugin: Any, entry: Any):
        self.phase = entry.phase
        self.key = entry.path

    def before(self, target: Target, args: tuple, kwargs: dict) -> Any:
        return session()

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if token is not None and error is not None:
            _record_error(self.phase, error, token)


_oom_logged: set[int] = set()  # ids of the OOM errors already logged (each phase it crosses sees it)


def _record_error(phase: str, error: BaseException, current: Any) -> None:
    """Keep, at the innermost phase it left, the first error other than CUDA OOM that ended vLLM's start-up
    (vLLM refusing to start, e.g. "No available memory for the cache blocks"): the run's verdict names it."""
    if type(error).__name__ == "OutOfMemoryError" or not isinstance(error, Exception):
        return
    if F.VLLM_STARTUP_ERROR in getattr(current, "facts", {}):
        return
    message = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    current.set_fact(F.VLLM_STARTUP_ERROR, {"phase": phase, "type": type(error).__name__, "message": message})


def _log_oom(phase: str, error: BaseException, current: Any) -> None:
    """Say once, at the innermost phase it crossed, that a CUDA OOM is vLLM's/PyTorch's error, not memtrace's."""
    kind = type(error)
    if kind.__name__ != "OutOfMemoryError" or not kind.__module__.startswith("torch") or id(error) in _oom_logged:
        return
    _oom_logged.add(id(error))
    log.warning(
        "memtrace: vLLM ran out of GPU memory in %s (torch.OutOfMemoryError, raised by PyTorch's allocator for "
        "vLLM; the error and its traceback are vLLM's, not memtrace's). memtrace only observed it: the trace "
        "with the failed request is %s",
        phase,
        getattr(current, "path", "?"),
    )
