"""The registry of fact keys: the one part of a trace file whose shape the format version does not spell out.

A trace's ``meta`` table holds a JSON document ``facts``: a dict from these keys to JSON values. This
module lists every key memtrace writes or reads, with its type, its unit and who writes it, so readers
and writers never spell a key twice. Code reads and writes facts only through these constants
(``tests/unit/test_facts_registry.py`` fails on a literal key anywhere else). Unknown keys found in a
file are kept as they are, so a newer writer's facts survive an older reader.

Bytes are integers of bytes, times integers of Unix-epoch microseconds, as everywhere in the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class FactKey:
    """One documented fact: its key in the ``facts`` document, JSON type, writer and meaning."""

    key: str
    type: str  # "int", "float", "str", "bool", "dict", "list"
    writer: str  # who writes it
    doc: str


REGISTRY: dict[str, FactKey] = {}


def _fact(key: str, type_: str, writer: str, doc: str) -> str:
    REGISTRY[key] = FactKey(key, type_, writer, doc)
    return key


# -- environment and capture ---------------------------------------------------------------------------
ENV = _fact(
    "env",
    "dict",
    "capture.env",
    "gpu_name, compute_capability, driver, cuda, torch, vllm, flashinfer, "
    "hostname, cmdline (secrets redacted), allocator settings and other fingerprint fields",
)
INSTALL_PATHS = _fact(
    "install_paths",
    "dict",
    "capture.session (capture.env.install_paths)",
    "where the recording process imported its libraries: {torch, vllm, flashinfer: the package's folder} "
    "from module.__file__ of those already imported when facts were written (none imported for this). "
    "Analysis tells a frame's library by them (analysis.holders.frames.library_dirs); a trace without them "
    "has its folders inferred from its frames",
)
MEMTRACE_VERSION = _fact("memtrace", "str", "capture.env", "the memtrace version that recorded the trace")
CAPTURE = _fact(
    "capture",
    "dict",
    "capture.session",
    "how the allocator history was drained (drains, clock skew) and skipped_actions: the actions torch was told not "
    "to record (['free_requested'] where torch can skip it; [] where it cannot: the trace then holds them). A trace "
    "without the key recorded free_requested at start-up and skipped it only in a held serving ring",
)
SERVING = _fact(
    "serving",
    "dict",
    "capture.serving_session",
    "MEMTRACE_UNTIL=serving: started_us (start-up written, rings begin), bounds (the rings' limits and "
    "ring_bytes_max, the most bytes they may hold), on_cpu (no allocator: the window holds scheduler steps "
    "and notes only); the window itself is the trace's ServingWindow (format 1.4, its others 1.5)",
)
CAPTURE_PREIMPORT_S = _fact(
    "capture_preimport_s",
    "float",
    "capture.session",
    "seconds spent importing torch's stack symbolizer before recording",
)
SELF_COST = _fact(
    "memtrace.self_cost",
    "dict",
    "capture.session (capture.selfcost, capture.history_cost)",
    "memtrace's own time on the traced process's threads (perf_counter_ns, exclusive): sources {name: {ns, "
    "calls}} (registration, start, calibration, hooks.<kind>, phases, writes, drain.<reason>, flush, oom, stop), "
    "total_ns, threads, memtrace_threads_ns (its own threads, not counted); history: the allocator history's "
    "calibration (measured, per_alloc_ns at depth, per_frame_ns, ...; or measured false and why) and "
    "recorded_allocs. A trace without it predates the measurement",
)
SIDECAR = _fact("sidecar", "dict", "capture.session", "the NVML sidecar: rate, samples, driver reserve, errors")
ALLOCATOR_SETTINGS = _fact(
    "allocator_settings",
    "dict",
    "capture.session (first drain), importers.torch_snapshot",
    "the snapshot's allocator_settings (expandable segments...)",
)
CUPTI = _fact(
    "cupti",
    "dict",
    "capture.cupti",
    "the optional CUPTI source: on, version, records, stacks matched, clock offset, errors",
)
CLOCK = _fact(
    "clock",
    "dict",
    "capture.clock, capture.ray_gather",
    "host, reference_host (the driver's), method ('same-host', 'ray': round trips to the driver's node, "
    "'unmeasured'), offset_us (driver time = trace time + offset_us; null when unmeasured), uncertainty_us, "
    "and for 'ray' rtt_us, rounds, measured_at_us",
)
RAY = _fact(
    "ray",
    "dict",
    "capture.ray_gather",
    "a Ray worker's node_id, node_ip, the driver's node_id, whether it is on the driver's node, the collector "
    "it hands its trace to and where the trace was written on its own node (local_path)",
)
MARKER = _fact("marker", "str", "tests", "a free-form label a test or script attaches to a run")

# -- the line not to cross, and the card -------------------------------------------------------------------
TARGET_BYTES = _fact(
    "target_bytes",
    "int",
    "plugins.vllm, examples",
    "the utilization target in bytes: vLLM's requested_memory = ceil(util x total)",
)
TARGET_SOURCE = _fact("target_source", "str", "plugins.vllm", "where target_bytes came from in vLLM")
UTIL = _fact(
    "gpu_memory_utilization",
    "float",
    "plugins.vllm, examples",
    "--gpu-memory-utilization as vLLM resolved it (0.34+: the user's value, else 1.0 with the extensible "
    "KV cache and 0.92 without)",
)
UTIL_SOURCE = _fact(
    "gpu_memory_utilization_source",
    "str",
    "plugins.vllm_facts",
    "'user' (set on the command line or in the config), 'vllm-default' (vLLM chose it: 0.34+ say so, "
    "before 0.34 the flag was absent from the command line) or 'unknown' (e.g. vLLM's Python API before 0.34)",
)
CAPACITY_BYTES = _fact(
    "capacity_bytes",
    "int",
    "examples, users",
    "the card the run stood for when smaller than the device (a per-process memory fraction)",
)
MEMORY_FRACTION = _fact("memory_fraction", "float", "examples", "torch's set_per_process_memory_fraction value")
PEAK_STATS_RESET_US = _fact("peak_stats_reset_us", "int", "examples", "when torch's peak counters were reset")
PEAK_RESETS_US = _fact(
    "memtrace.peak_resets_us",
    "list",
    "plugins.vllm",
    "when vLLM reset torch's peak counters (torch.accelerator/torch.cuda reset_peak_memory_stats), in order: "
    "a peak vLLM reads (its transient peak, max_memory_reserved) counts from the last reset before it",
)

# -- what happened -----------------------------------------------------------------------------------------
OOM = _fact(
    "oom",
    "dict",
    "capture.session (OOM observer), importers.torch_snapshot",
    "time_us, device, requested_bytes, device_total_bytes, device_free_bytes, phase",
)
IMPORT = _fact(
    "import",
    "dict",
    "importers.torch_snapshot",
    "how a torch snapshot or profiler trace was imported: device, devices (all with history), "
    "clock ('recorded', 'synthetic': no time_us before PyTorch 2.1, 'none': a state without history), "
    "stacks ('python', 'all', 'ops': profiler operator names), state ('recorded': the final allocator state "
    "is known; 'moment': the snapshot is that state alone, no timeline; 'missing': no state although memory "
    "was held, so figures are lower bounds; 'totals': a profiler trace's own running totals), "
    "unknown_actions ({action: [entries, bytes]} left out), memory ('device' or 'pinned host' / 'host'), "
    "header (a profiler trace's own: gpus [{name, total_bytes}], cuda_runtime, vllm; importers.kineto)",
)
SNAPSHOT_FIELDS = _fact(
    "snapshot_fields",
    "dict",
    "importers.torch_snapshot (importers.snapshot_fields)",
    "the trace entries' compile_context, user_metadata (annotate payloads) and pool_id: "
    "{values: [[context, metadata, [a, b]]], runs: [[first_event, count, value]]}; torch's defaults elsewhere",
)
DIED_IN = _fact("died_in", "str", "examples", "the phase path the example script died in")
STARTUP_OUTCOME = _fact("startup_outcome", "dict", "examples", "the example's own account of how it ended")
TORCH_COUNTERS = _fact("torch_counters", "list", "examples", "torch's own counters at phase ends (validation)")
PHASE_MEMORY = _fact(
    "memtrace.phase_memory",
    "dict",
    "plugins.vllm_boundaries",
    "cudaMemGetInfo / torch counters (current and peak since the last reset) read at vLLM's phase boundaries",
)

# -- vLLM's own figures --------------------------------------------------------------------------------------
VLLM_VERSION = _fact("vllm.version", "str", "plugins.vllm", "vLLM's version string")
VLLM_CONFIG = _fact(
    "vllm.config",
    "dict",
    "plugins.vllm",
    "model, max_model_len, max_num_batched_tokens, "
    "max_num_seqs, kv_cache_dtype, tensor_parallel_size and the other memory-relevant flags",
)
VLLM_MODEL_SHAPE = _fact(
    "vllm.model_shape",
    "dict",
    "plugins.vllm",
    "the model's shape from vLLM's text config (vocabulary, layers, heads, head size, experts, layer kinds) "
    "and the CUDA-graph capture sizes vLLM resolved",
)
VLLM_KV_GROUPS = _fact(
    "vllm.kv_cache_groups",
    "list",
    "plugins.vllm",
    "vLLM's KV cache groups: spec kind, layers, tokens and bytes per block, sliding window",
)
VLLM_HOOK_TARGETS = _fact("vllm.hook_targets", "list", "plugins.vllm", "the vLLM methods the plugin wrapped")
VLLM_STARTUP_COMPLETE_US = _fact("vllm.startup_complete_us", "int", "plugins.vllm", "end of warm-up")
PROCESS_START_US = _fact(
    "process.start_us", "int", "capture.env", "when the traced process started (the kernel's record, ±10 ms)"
)
VLLM_STARTUP_ERROR = _fact(
    "vllm.startup_error",
    "dict",
    "plugins.vllm_phases",
    "the first exception other than CUDA OOM that left a start-up phase: phase, type, message (first 300 characters)",
)
VLLM_AVAILABLE_KV_BYTES = _fact(
    "vllm.available_kv_cache_bytes", "int", "plugins.vllm", "Worker.determine_available_memory's return value"
)
VLLM_KV_TOKENS = _fact(
    "vllm.kv_cache_tokens",
    "int",
    "plugins.vllm",
    "GPU KV cache size in tokens, of the blocks vllm.kv_cache_blocks counts (0 when vLLM refused)",
)
VLLM_KV_BYTES = _fact(
    "vllm.kv_cache_bytes",
    "int",
    "plugins.vllm_facts",
    "bytes of the KV cache: its tensors (profiled sizing), or what the extensible KV cache committed through "
    "CUDA VMM (vLLM 0.34+: at kv_cache_extend, or at kv_cache_sizing when vLLM sized 0 blocks)",
)
VLLM_KV_BLOCKS = _fact(
    "vllm.kv_cache_blocks",
    "int",
    "plugins.vllm_facts",
    "KV cache blocks vLLM sized: allocated at kv_cache_init (profiled sizing); for the extensible KV cache "
    "(vLLM 0.34+) the blocks committed, its post-warm-up sizing's result (0 when vLLM refused to start), never "
    "the address range's capacity (vllm.kv_cache_sizing's capacity_blocks); absent before the cache was sized",
)
VLLM_WEIGHTS_BYTES = _fact("vllm.weights_memory_bytes", "int", "plugins.vllm", "model_runner.model_memory_usage")
VLLM_PROFILE = _fact("vllm.profile", "dict", "plugins.vllm_facts", "the worker's memory-profiling attributes")
VLLM_GRAPH_ESTIMATE_BYTES = _fact(
    "vllm.cudagraph_memory_estimate_bytes", "int", "plugins.vllm", "profile_cudagraph_memory's estimate"
)
VLLM_KV_SIZE_SOURCE = _fact(
    "vllm.kv_cache_size_source",
    "str",
    "plugins.vllm",
    "how vLLM sized the KV cache: 'profiling' (its estimate from profile_run), 'extensible' (0.34+: "
    "measured after warm-up and CUDA-graph capture, then committed outside PyTorch's allocator), "
    "'--kv-cache-memory-bytes' or 'VLLM_ENABLE_STARTUP_PLAN' (a persisted plan); the last two skip the "
    "memory profiling (profile_run still runs)",
)
#: The values of UTIL_SOURCE (the plugin writes them, analysis reads them).
UTIL_BY_USER = "user"
UTIL_VLLM_DEFAULT = "vllm-default"
UTIL_UNKNOWN = "unknown"
#: What the recorder writes in place of a secret (a command line's ``--api-key`` value, ``HF_TOKEN``...).
REDACTED = "<redacted>"
#: The values of VLLM_KV_SIZE_SOURCE (the plugin writes them, analysis and outputs read them).
KV_SIZED_BY_PROFILING = "profiling"
KV_SIZED_EXTENSIBLE = "extensible"
KV_SIZE_GIVEN_FLAG = "--kv-cache-memory-bytes"
KV_SIZE_GIVEN_PLAN = "VLLM_ENABLE_STARTUP_PLAN"
VLLM_KV_SIZING = _fact(
    "vllm.kv_cache_sizing",
    "dict",
    "plugins.vllm_facts",
    "vLLM 0.34's extensible sizing (measure_kv_cache_blocks): its inputs init_free_memory_bytes, "
    "requested_memory_bytes, free_memory_bytes (vLLM's own cudaMemGetInfo after empty_cache), "
    "committed_bytes, transient_peak_bytes, torch_reserve_growth_bytes, margin_floor_bytes, "
    "margin_fraction, non_torch_reserve_bytes, bytes_per_block; its result num_blocks; "
    "torch_memory_limit_bytes (the cap it put on PyTorch's allocator); time_us",
)
VLLM_TRANSIENT_PEAKS = _fact(
    "vllm.transient_peaks",
    "list",
    "plugins.vllm",
    "each call of vLLM 0.34's ExtensibleKVCache.record_transient_peak: time_us, torch's allocated_bytes, "
    "allocated_peak_bytes, reserved_bytes, reserved_peak_bytes as it read them, and the cache's "
    "reserved_headroom_bytes (the transient it keeps free) after the call. torch_reserve_growth_bytes is "
    "read then too; vLLM raises it after the call, so the next item or vllm.kv_cache_sizing holds its final value",
)
VLLM_EXTENSIBLE_KV = _fact(
    "vllm.extensible_kv_cache",
    "dict",
    "plugins.vllm_facts",
    "vLLM 0.34's extensible KV cache after kv_cache_extend: capacity_blocks, reserved_bytes (address "
    "space), granularity_bytes, bytes_per_block, committed_blocks, physical_bytes, torch_memory_limit_bytes",
)
VLLM_PLUGINS = _fact(
    "vllm.plugins",
    "dict",
    "plugins.vllm_facts",
    "VLLM_PLUGINS as the worker saw it (null = unset) and the general/platform plugins vLLM loads with it",
)
VLLM_NON_TORCH_AT_INIT_BYTES = _fact(
    "vllm.non_torch_at_init_bytes", "int", "plugins.vllm_facts", "non-torch memory in vLLM's init snapshot"
)


def is_vllm(facts: dict) -> bool:
    """True for a trace the vLLM plugin recorded (vLLM's own checks and formulas apply)."""
    return VLLM_VERSION in facts or VLLM_CONFIG in facts


#: The first vLLM with the extensible KV cache, sized after warm-up (its default): (major, minor)
VLLM_EXTENSIBLE_SINCE = (0, 34)


def vllm_release(version: object) -> tuple[int, int] | None:
    """(major, minor) of a recorded vLLM version (:data:`VLLM_VERSION`: "0.34.0", "0.25.1.dev4+g..."); None if not one."""
    m = re.match(r"(\d+)\.(\d+)", str(version or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def int_fact(facts: dict, key: str) -> int | None:
    """``facts[key]`` as an int when it is a number (not a bool), else None."""
    v = facts.get(key)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def kv_tokens_per_block(facts: dict) -> int | None:
    """Tokens a KV cache block holds: vLLM's tokens over its blocks when both were recorded and not 0, else the
    configured ``block_size`` (``vllm.config``), else None."""
    tokens, blocks = int_fact(facts, VLLM_KV_TOKENS), int_fact(facts, VLLM_KV_BLOCKS)
    if tokens and blocks:
        return round(tokens / blocks)
    size = (facts.get(VLLM_CONFIG) or {}).get("block_size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def with_committed_kv_cache(facts: dict) -> dict:
    """``facts`` with an extensible KV cache's blocks, tokens and bytes as :data:`VLLM_KV_BLOCKS` means them.

    Traces recorded before 2026-12-04 kept what ``kv_cache_init`` saw for an extensible KV cache (vLLM 0.34):
    its address range's capacity (264,297 blocks on the H200's ``small-r2048``), overwritten only when vLLM
    extended the cache. Where it never did (vLLM sized 0 blocks and refused to start, or the recording ended
    first), the sizing's own result (``vllm.kv_cache_sizing``'s ``num_blocks``) replaces them, or, with no
    result, they are dropped (:func:`sized_kv_facts`, what the plugin writes now: its facts come out unchanged)."""
    if facts.get(VLLM_KV_SIZE_SOURCE) != KV_SIZED_EXTENSIBLE or VLLM_EXTENSIBLE_KV in facts:
        return facts
    sizing = facts.get(VLLM_KV_SIZING) or {}
    blocks = sizing.get("num_blocks")
    if facts.get(VLLM_KV_BLOCKS) == blocks:
        return facts
    out = {k: v for k, v in facts.items() if k not in (VLLM_KV_BLOCKS, VLLM_KV_TOKENS, VLLM_KV_BYTES)}
    if isinstance(blocks, int) and not isinstance(blocks, bool):
        out.update(sized_kv_facts(blocks, sizing.get("committed_bytes")))
    return out


def sized_kv_facts(blocks: int, committed_bytes: object) -> dict:
    """The KV facts of an extensible KV cache at its sizing (vLLM 0.34's ``measure_kv_cache_blocks`` returned
    ``blocks``): the blocks; when 0 (vLLM refuses to start) also 0 tokens and the bytes committed then (the
    granules warm-up used). Otherwise tokens and bytes wait for ``kv_cache_extend``, which commits them."""
    out: dict = {VLLM_KV_BLOCKS: blocks}
    if blocks == 0:
        out[VLLM_KV_TOKENS] = 0
        if isinstance(committed_bytes, int) and not isinstance(committed_bytes, bool):
            out[VLLM_KV_BYTES] = committed_bytes
    return out
