"""The environment fingerprint of a run (the "matrix key"): what must match for two runs to compare.

Two start-ups are comparable when they ran the same kind of program (a vLLM start-up, a plain PyTorch
script, an imported snapshot) on the same GPU model with the same driver, CUDA, torch, vLLM and
FlashInfer, for the same model, with the same flags that change memory (vLLM's batch and length
limits, KV-cache dtype, parallelism, graph mode, ``--gpu-memory-utilization``, the card a run stood
for). ``diff`` warns with :func:`differences` when they are not; ``history`` files runs under
:func:`matrix_key` so that a run is only ever checked against runs of the same key.

What is left out on purpose: host names, GPU serial numbers, paths, ports and free-form command-line
arguments (a patched workspace size is exactly what the gate must catch, not a different key).
"""

from __future__ import annotations

import hashlib
import json
import os

from memtrace import facts as F
from memtrace.analysis.memory.target import card_capacity
from memtrace.model import Trace
from memtrace.units import format_gib

#: Environment fields, in the order they are shown.
ENV_FIELDS = ("gpu", "driver", "cuda", "torch", "vllm", "flashinfer")
#: vLLM configuration entries that change how much memory a start-up takes.
MEMORY_FLAGS = (
    "max_model_len",
    "max_num_batched_tokens",
    "max_num_seqs",
    "kv_cache_dtype",
    "dtype",
    "quantization",
    "block_size",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "enable_expert_parallel",
    "enforce_eager",
    "compilation_mode",
    "cudagraph_mode",
    "moe_backend",
    "use_v2_model_runner",
)
#: Shown for a field a run did not record.
UNKNOWN = "—"


def trace_env(trace: Trace) -> dict:
    """The recorded environment (``facts.ENV``); {} when none was recorded."""
    e = trace.facts.get(F.ENV)
    return e if isinstance(e, dict) else {}


def vllm_config(trace: Trace) -> dict:
    """vLLM's recorded configuration (``facts.VLLM_CONFIG``); {} when none was recorded."""
    c = trace.facts.get(F.VLLM_CONFIG)
    return c if isinstance(c, dict) else {}


def vllm_version(trace: Trace) -> str | None:
    """The vLLM version the run recorded (its environment's, else the plugin's fact)."""
    return trace_env(trace).get("vllm") or trace.facts.get(F.VLLM_VERSION)


def _text(value) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def program_kind(trace: Trace) -> str:
    """``vllm`` (the vLLM plugin recorded it), ``snapshot`` (an imported PyTorch snapshot) or ``pytorch``."""
    return "vllm" if F.is_vllm(trace.facts) else "snapshot" if trace.recording.source != "memtrace" else "pytorch"


def program_name(env: dict) -> str:
    """The program a run executed, from the recorded command line: the module of ``python -m mod``,
    else the first ``.py`` file named (``torchrun --nproc 2 train.py`` ran ``train.py``), else the
    command's file name; "" when no command was recorded."""
    cmd = env.get("cmdline")
    if not isinstance(cmd, list) or not cmd:
        return ""
    args = [str(a) for a in cmd]
    if os.path.basename(args[0]).startswith("python") and len(args) > 1:
        args = args[1:]
        if args[0] == "-m" and len(args) > 1:
            return args[1]
    script = next((a for a in args if a.endswith(".py")), args[0])
    return os.path.basename(script)


def fingerprint(trace: Trace) -> dict[str, str]:
    """The matrix-key fields of ``trace`` as text, known fields only, in a stable order.

    ``kind``, the environment (:data:`ENV_FIELDS`), ``model`` (vLLM's model, else the script's
    name), the vLLM flags of :data:`MEMORY_FLAGS`, ``gpu_memory_utilization`` and ``card_bytes``
    (the card the run stood for, only when smaller than the device: a run on the whole card and one
    that recorded the whole card as its capacity are the same), ``cupti`` ("on" when the optional
    CUPTI source recorded: its own 12,582,912 B of device memory on the H200 change what vLLM sizes,
    so a run with it does not compare with one without).
    """
    facts, env, config, kind = trace.facts, trace_env(trace), vllm_config(trace), program_kind(trace)
    values = {"kind": kind, **{f: env.get("gpu_name" if f == "gpu" else f) for f in ENV_FIELDS}}
    values["vllm"] = vllm_version(trace)
    values["model"] = config.get("model") or (program_name(env) if kind == "pytorch" else None)
    values.update({flag: config.get(flag) for flag in MEMORY_FLAGS})
    values["gpu_memory_utilization"] = facts.get(F.UTIL)
    values["kv_cache_sizing"] = kv_cache_sizing(trace) if kind == "vllm" else None
    card, source = card_capacity(trace)
    device = trace.process.device_total_bytes
    smaller = source == "recorded card" and (not device or card < device)
    values["card_bytes"] = card if smaller else None  # only a run that stood for a smaller card
    cupti = facts.get(F.CUPTI)
    values["cupti"] = "on" if (isinstance(cupti, dict) and cupti.get("records")) or len(trace.device_allocs) else None
    return {k: t for k, v in values.items() if (t := _text(v))}


def kv_cache_sizing(trace: Trace) -> str | None:
    """How vLLM sized the KV cache (``facts.VLLM_KV_SIZE_SOURCE``), or its known default for a trace recorded
    before the plugin wrote that fact: the size given when the command line holds ``--kv-cache-memory-bytes``,
    else profiling before vLLM 0.34 (the only way those releases size it). None where no default is known
    (0.34+ without the fact, an unknown version): the key then leaves the field out rather than differ."""
    recorded = trace.facts.get(F.VLLM_KV_SIZE_SOURCE)
    if recorded:
        return str(recorded)
    argv = [str(a).split("=", 1)[0] for a in trace_env(trace).get("cmdline") or []]
    if "--kv-cache-memory-bytes" in argv:
        return F.KV_SIZE_GIVEN_FLAG
    version = F.vllm_release(vllm_version(trace))
    if version is not None and version < F.VLLM_EXTENSIBLE_SINCE:
        return F.KV_SIZED_BY_PROFILING
    return None


def left_to_vllm(trace: Trace) -> frozenset[str]:
    """The fingerprint fields whose value vLLM chose itself in this run: a flag of :data:`MEMORY_FLAGS`
    (and ``--gpu-memory-utilization``) absent from the recorded command line, the utilization when vLLM
    says it resolved its own default (``facts.UTIL_SOURCE``), and the KV cache's sizing mode unless the
    user picked one. A new release may change those by itself; ``diff`` says so instead of calling the
    runs incomparable. Empty when the command line was not recorded."""
    argv = [a.split("=", 1)[0] for a in trace_env(trace).get("cmdline") or [] if isinstance(a, str)]
    if not argv:
        return frozenset()
    if not flags_readable(argv):  # which flags the user gave is not known: claim none was left to vLLM
        return frozenset({"gpu_memory_utilization"} if trace.facts.get(F.UTIL_SOURCE) == F.UTIL_VLLM_DEFAULT else ())
    given = {a[2:].replace("-", "_") for a in argv if a.startswith("--")}
    out = {f for f in (*MEMORY_FLAGS, "gpu_memory_utilization") if f not in given}
    if trace.facts.get(F.UTIL_SOURCE) == F.UTIL_VLLM_DEFAULT:
        out.add("gpu_memory_utilization")
    if not given & {"enable_extensible_kv_cache", "no_enable_extensible_kv_cache", "kv_cache_memory_bytes"}:
        out.add("kv_cache_sizing")
    return frozenset(out)


def flags_readable(argv: list[str]) -> bool:
    """False when a recorded command line lost a flag's name: a ``<redacted>`` standing where a name would,
    followed by a value (``--skip-tokenizer-init <redacted> 127.0.0.1``). Traces recorded before memtrace
    stopped treating every name that holds "token" as a secret have them; there a missing flag proves
    nothing. A secret's own value (``--api-key <redacted>``) is followed by the next flag or the end."""
    return not any(
        a == F.REDACTED and i + 1 < len(argv) and not argv[i + 1].startswith("-") for i, a in enumerate(argv)
    )


def matrix_key(fp: dict[str, str]) -> str:
    """A short stable id of a fingerprint (16 hex digits of its SHA-256)."""
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def describe(fp: dict[str, str]) -> str:
    """One line naming a fingerprint: ``vllm · NVIDIA H200 · torch 2.11.0 · vllm 0.25.1 · model``."""
    parts = [fp.get("kind", UNKNOWN), fp.get("gpu", "")]
    parts += [f"{k} {fp[k]}" for k in ("torch", "vllm", "flashinfer") if k in fp]
    parts.append(fp.get("model", ""))
    if fp.get("card_bytes", "").isdigit():
        parts.append(f"card {format_gib(int(fp['card_bytes']))}")
    return " · ".join(p for p in parts if p)


def differences(base: dict[str, str], new: dict[str, str]) -> list[tuple[str, str, str]]:
    """Fields whose values differ: (field, base value, new value), ``—`` where a run lacks it."""
    pairs = ((k, base.get(k, UNKNOWN), new.get(k, UNKNOWN)) for k in dict.fromkeys([*base, *new]))
    return [(k, b, n) for k, b, n in pairs if b != n]
