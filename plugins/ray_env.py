"""memtrace's switches reach vLLM's Ray workers, and the run's collector starts with Ray.

vLLM's Ray executors and its Ray data-parallel engine actors copy to the workers only the names
``vllm.ray.ray_env.get_env_vars_to_copy`` returns: vLLM's registered variables, the prefixes ``VLLM_``,
``FLASH_ATTENTION_``, ``LMCACHE_``, ``NCCL_``, ``UCX_``, ``HF_``, ``HUGGING_FACE_``, and what the user lists
in ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` / ``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY`` (0.32 and 0.34 alike).
``MEMTRACE``, ``MEMTRACE_DIR`` and the other switches are none of those.

:class:`CopyListHook` adds every ``MEMTRACE*`` variable set in this process to the set that function
returns (in place: it is a ``set``), so every caller — the executors and the engine-actor launcher,
which import it by name — hands them on. Nothing in the environment changes. In particular memtrace
does **not** append to ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY``, which it did at first: vLLM hashes
every registered ``VLLM_*`` variable into torch.compile's cache key (``vllm/envs.py``,
``compile_factors``; that one is not in its ``ignored_factors``), so on the H200 a start-up with memtrace
missed the compile cache that one without it had filled (vLLM 0.34.0: "compilation: 20.66 s" against
0.38 s). Which plugins vLLM loads is never touched either: ``VLLM_PLUGINS`` is left as it is.

:class:`RayClusterHook` wraps vLLM's ``initialize_ray_cluster``: when it returns, Ray is up in the
driver (the engine core) and the workers do not exist yet, so the run's collector starts there
(:func:`memtrace.capture.ray_gather.start_collector`); its name is a ``MEMTRACE*`` variable too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("memtrace")

#: The prefix of every memtrace switch (``MEMTRACE`` itself and every ``MEMTRACE_*``).
PREFIX = "MEMTRACE"
#: The copy list every vLLM Ray launcher asks for (its callers import it by name; the hook rebinds them).
COPY_LIST_TARGET = "vllm.ray.ray_env:get_env_vars_to_copy"
#: Where vLLM starts Ray in the process that drives the workers (0.32 and 0.34).
RAY_CLUSTER_TARGET = "vllm.v1.executor.ray_utils:initialize_ray_cluster"


def switches(environ: Mapping[str, str] | None = None) -> set[str]:
    """The names of memtrace's switches set in ``environ`` (default: this process's)."""
    environ = os.environ if environ is None else environ
    return {name for name in environ if name.startswith(PREFIX)}


class CopyListHook:
    """A hooks.Handler around ``get_env_vars_to_copy``: memtrace's switches join the names it returns."""

    key = COPY_LIST_TARGET
    cost_source = "ray"

    def __init__(self, plugin: Any = None, entry: Any = None):
        pass  # built from a ``surface`` entry; it keeps nothing

    def before(self, target: Any, args: tuple, kwargs: dict) -> Any:
        return True

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if error is None and isinstance(result, set):
            result.update(switches())


class RayClusterHook:
    """A hooks.Handler around ``initialize_ray_cluster``: start the run's collector once Ray is up."""

    key = RAY_CLUSTER_TARGET
    cost_source = "ray"

    def __init__(self, plugin: Any = None, entry: Any = None):
        pass  # built from a ``surface`` entry; it keeps nothing

    def before(self, target: Any, args: tuple, kwargs: dict) -> Any:
        return True

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if error is not None:
            return
        from memtrace.capture import ray_gather

        try:
            ray_gather.start_collector()
        except Exception as exc:  # noqa: BLE001 - vLLM goes on; workers on other nodes keep their traces
            log.warning(
                "memtrace: no trace collector on the driver's node (%s: %s); Ray workers on other nodes write "
                "their traces on their own disk",
                type(exc).__name__,
                exc,
            )
