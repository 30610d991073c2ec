"""What a reader of an upstream issue needs to know about a run: the environment table, the command
line, the allocator settings, with shareable paths.

The environment fields shown are those of the matrix key (``history_key``, which decides whether two
runs compare) plus the versions and the flags that change memory; figure titles are
``plots.titles``. Paths on the recording machine (``/tmp/model``,
``/opt/venv/bin/python3``) are shown by their last component only, so nothing local leaks into an
upstream issue.
"""

from __future__ import annotations

import os
from typing import Any

from memtrace import facts as F
from memtrace.analysis.gate.history_key import MEMORY_FLAGS as _KEY_FLAGS
from memtrace.analysis.gate.history_key import program_name, vllm_config, vllm_version
from memtrace.analysis.gate.history_key import trace_env as env
from memtrace.analysis.memory.target import card_capacity
from memtrace.model import Trace
from memtrace.units import format_gib

#: vLLM flags shown in the environment table: the model, then the flags that change memory (the
#: matrix key's own list, ``history_key.MEMORY_FLAGS``: one list of them).
MEMORY_FLAGS = ("model", "architecture", *_KEY_FLAGS)


def public_path(value: Any) -> Any:
    """An absolute local path reduced to its last component (``/tmp/model`` -> ``model``); other values as they are."""
    if isinstance(value, str) and value.startswith("/") and " " not in value:
        return os.path.basename(value.rstrip("/")) or value
    return value


def model_name(trace: Trace) -> str:
    """The model as a reader knows it ("" when not recorded): a Hugging Face id as given, else the
    architecture vLLM resolved, else the served name (a local path alone says nothing upstream)."""
    cfg = vllm_config(trace)
    model = str(cfg.get("model") or "")
    local = not model or model.startswith(("/", ".", "~")) or model.count("/") > 1
    arch = str(cfg.get("architecture") or "")
    if model and not local:
        return model
    if arch:
        return arch
    served = str(cfg.get("served_model_name") or "")
    return os.path.basename((served or model).rstrip("/"))


def gpu_name(trace: Trace) -> str:
    """The GPU, and the card the run stood for when that is smaller ("NVIDIA H200 as a 16 GiB card")."""
    gpu = str(env(trace).get("gpu_name") or "")
    stood_for, source = card_capacity(trace)  # the one owner of "the card the run stood for"
    physical = trace.process.device_total_bytes
    if source == "recorded card" and stood_for and physical and stood_for < physical:
        return f"{gpu or 'GPU'} as a {format_gib(stood_for, 2).replace('.00 ', ' ')} card"
    return gpu


def describe_run(trace: Trace, fallback: str = "") -> str:
    """What ran, with what, on what (``"Qwen3MoeForCausalLM, vLLM 0.25.1, NVIDIA H200"``): the model,
    the vLLM version (else the program a plain PyTorch run executed), the GPU; the parts that were
    recorded, joined by commas; ``fallback`` when none was."""
    version = vllm_version(trace)
    parts = [model_name(trace), f"vLLM {version}" if version else program_name(env(trace)), gpu_name(trace)]
    parts = [p for p in parts if p]
    return ", ".join(parts) if parts else fallback


def environment(trace: Trace) -> list[tuple[str, str]]:
    """The environment fingerprint as (label, value) rows, in reading order; unknown values left out."""
    e, cfg = env(trace), vllm_config(trace)
    total = e.get("total_memory_bytes") or trace.process.device_total_bytes
    rows: list[tuple[str, Any]] = [
        ("GPU", e.get("gpu_name")),
        ("compute capability", e.get("compute_capability")),
        ("GPU memory", format_gib(total) if total else None),
        ("driver", e.get("driver")),
        ("CUDA", e.get("cuda")),
        ("torch", e.get("torch")),
        ("vLLM", vllm_version(trace)),
        ("FlashInfer", e.get("flashinfer")),
        ("Python", e.get("python")),
        ("memtrace", e.get("memtrace") or trace.facts.get(F.MEMTRACE_VERSION)),
        ("--gpu-memory-utilization", trace.facts.get(F.UTIL)),
    ]
    rows += [(k, public_path(cfg[k])) for k in MEMORY_FLAGS if cfg.get(k) is not None]
    rows += _imported(trace)
    return [(k, str(v)) for k, v in rows if v not in (None, "")]


#: What recorded an imported file, by ``facts["import"]["format"]`` (a torch snapshot when none is named).
RECORDED_BY = {
    "kineto": "torch.profiler with profile_memory=True (a Kineto trace; vLLM's --profiler-config writes one per process)",
}
SNAPSHOT_RECORDED_BY = "torch.cuda.memory._dump_snapshot (a PyTorch snapshot; no versions recorded)"


def _imported(trace: Trace) -> list[tuple[str, Any]]:
    """What an imported file says about where it came from: what recorded it, and what a profiler trace's own
    header names (its GPU, the CUDA runtime, vLLM's version); a torch snapshot records no versions."""
    imp = trace.facts.get(F.IMPORT)
    if not isinstance(imp, dict):
        return []
    devices = imp.get("devices") or []
    settings = allocator_settings(trace)
    header = imp.get("header") or {}
    gpus = ", ".join(f"{g['name']} ({format_gib(g['total_bytes'])})" for g in header.get("gpus", []))
    return [
        ("recorded by", RECORDED_BY.get(str(imp.get("format")), SNAPSHOT_RECORDED_BY)),
        ("GPU (the trace's header)", gpus or None),
        ("CUDA runtime (the trace's header)", header.get("cuda_runtime")),
        ("vLLM (the trace's header)", header.get("vllm") if not vllm_version(trace) else None),
        ("devices", ", ".join(f"cuda:{d}" for d in devices) if devices else None),
        ("Python stacks", imp.get("stacks")),
        ("allocator settings", ", ".join(f"{k}:{v}" if v else k for k, v in sorted(settings.items())) or None),
    ]


def command_line(trace: Trace) -> str:
    """The recorded command (secrets were redacted at capture), local paths shortened."""
    cmd = env(trace).get("cmdline")
    return " ".join(str(public_path(c)) for c in cmd) if isinstance(cmd, list) else str(cmd or "")


def allocator_settings(trace: Trace) -> dict[str, str]:
    """The caching allocator's settings in force: torch's own ``allocator_settings`` from the first
    snapshot when recorded, else ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF`` as set; {} for
    PyTorch's defaults (or a trace that recorded neither)."""
    recorded = trace.facts.get(F.ALLOCATOR_SETTINGS)
    if isinstance(recorded, dict) and recorded:
        return {str(k): str(v) for k, v in recorded.items()}
    environ = env(trace).get("environ") or {}
    conf = environ.get("PYTORCH_CUDA_ALLOC_CONF") or environ.get("PYTORCH_ALLOC_CONF") or ""
    parts = [part.partition(":") for part in str(conf).split(",")]
    return {key.strip(): value.strip() if sep else "" for key, sep, value in parts if key.strip()}
