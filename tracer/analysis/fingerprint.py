"""Who recorded a trace and on what: the environment fingerprint, the run's title, shareable paths.

One owner for the facts that identify a run (GPU, driver, CUDA, torch, vLLM, FlashInfer, model and the
flags that change memory): the issue bundle's environment table, every figure's title and the
comparability check of two runs read them from here. Paths on the recording machine (``/tmp/model``,
``/opt/venv/bin/python3``) are shown by their last component only, so nothing local leaks into an
upstream issue.
"""

from __future__ import annotations

import os
from typing import Any

from .. import facts as F
from ..model import Trace

#: vLLM flags (``facts["vllm.config"]`` keys) that change how much memory a start-up takes.
MEMORY_FLAGS = (
    "model",
    "architecture",
    "moe_backend",
    "quantization",
    "dtype",
    "kv_cache_dtype",
    "max_model_len",
    "max_num_batched_tokens",
    "max_num_seqs",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "cudagraph_mode",
    "enforce_eager",
    "block_size",
)


def public_path(value: Any) -> Any:
    """An absolute local path reduced to its last component (``/tmp/model`` -> ``model``); other values as they are."""
    if isinstance(value, str) and value.startswith("/") and " " not in value:
        return os.path.basename(value.rstrip("/")) or value
    return value


def env(trace: Trace) -> dict[str, Any]:
    e = trace.facts.get(F.ENV)
    return e if isinstance(e, dict) else {}


def vllm_config(trace: Trace) -> dict[str, Any]:
    c = trace.facts.get(F.VLLM_CONFIG)
    return c if isinstance(c, dict) else {}


def vllm_version(trace: Trace) -> str | None:
    return env(trace).get("vllm") or trace.facts.get(F.VLLM_VERSION)


def model_name(trace: Trace) -> str | None:
    """The model as a reader knows it: the served name or path's last component, with the architecture
    when the name is a local folder (``model (Qwen3MoeForCausalLM)``)."""
    cfg = vllm_config(trace)
    model = cfg.get("model")
    if not model:
        return None
    shown = public_path(model)
    arch = cfg.get("architecture")
    if arch and shown != model:
        return f"{shown} ({arch})"
    return str(shown)


def environment(trace: Trace) -> list[tuple[str, str]]:
    """The environment fingerprint as (label, value) rows, in reading order; unknown values left out."""
    from ..units import format_gib

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
    return [(k, str(v)) for k, v in rows if v not in (None, "")]


def command_line(trace: Trace) -> str:
    """The recorded command (secrets were redacted at capture), local paths shortened."""
    cmd = env(trace).get("cmdline")
    if isinstance(cmd, list):
        return " ".join(str(public_path(c)) for c in cmd)
    return str(cmd or "")


def title(trace: Trace) -> str:
    """A figure's title from the trace's facts: "GPU memory during vLLM 0.25.1 start-up: model (Arch) on NVIDIA H200"."""
    version = vllm_version(trace)
    what = f"vLLM {version} start-up" if version else "start-up"
    model = model_name(trace)
    gpu = env(trace).get("gpu_name")
    on = " on ".join(x for x in (model, gpu) if x)
    return f"GPU memory during {what}" + (f": {on}" if on else "")


def identity(trace: Trace) -> dict[str, str]:
    """The fields that make two runs comparable (GPU, versions, model, memory flags), as strings."""
    e, cfg = env(trace), vllm_config(trace)
    out = {
        "gpu": e.get("gpu_name"),
        "driver": e.get("driver"),
        "cuda": e.get("cuda"),
        "torch": e.get("torch"),
        "vllm": vllm_version(trace),
        "flashinfer": e.get("flashinfer"),
        "gpu_memory_utilization": trace.facts.get(F.UTIL),
    }
    out.update({k: cfg.get(k) for k in MEMORY_FLAGS})
    return {k: str(v) for k, v in out.items() if v not in (None, "")}
