"""memtrace's switches reach vLLM's Ray workers, and the run's collector starts with Ray.

vLLM's Ray executor (``RayDistributedExecutor``, ``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``) and its Ray
data-parallel engine actors copy to the workers only vLLM's registered variables, the names with the
prefixes ``VLLM_``, ``FLASH_ATTENTION_``, ``LMCACHE_``, ``NCCL_``, ``UCX_``, ``HF_``, ``HUGGING_FACE_``,
``PYTHONHASHSEED`` and what the user lists in ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` /
``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY`` (``vllm/ray/ray_env.py``, ``get_env_vars_to_copy``: comma-separated,
tokens stripped, additive). ``MEMTRACE``, ``MEMTRACE_DIR`` and the other switches are none of those, so
:func:`carry` appends the prefix ``MEMTRACE`` to ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` (every
``MEMTRACE*`` variable, ``MEMTRACE`` itself included), keeping what the user put there, byte for byte.
(``RayExecutorV2``, vLLM 0.32's default, copies the driver's whole environment anyway.) Which plugins
vLLM loads is never touched: ``VLLM_PLUGINS`` is left as it is.

:class:`RayClusterHook` wraps vLLM's ``initialize_ray_cluster``: when it returns, Ray is up in the
driver (the engine core) and the workers do not exist yet, so the run's collector starts there
(:func:`memtrace.capture.ray_gather.start_collector`) and its name joins the variables vLLM copies.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from typing import Any

log = logging.getLogger("memtrace")

PREFIXES_ENV = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
#: The prefix that carries every memtrace switch (``MEMTRACE`` itself and every ``MEMTRACE_*``).
PREFIX = "MEMTRACE"
#: Where vLLM starts Ray in the process that drives the workers (0.32; imported by name by its executors).
RAY_CLUSTER_TARGET = "vllm.v1.executor.ray_utils:initialize_ray_cluster"


def prefixes_with_memtrace(value: str | None) -> str:
    """``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` with ``MEMTRACE`` appended, unless one of the user's
    prefixes already covers it. vLLM splits on commas and strips each token; so does this test."""
    value = value or ""
    tokens = [t.strip() for t in value.split(",") if t.strip()]
    if any(PREFIX.startswith(t) for t in tokens):
        return value
    return f"{value},{PREFIX}" if tokens else PREFIX


def carry(environ: MutableMapping[str, str] | None = None) -> bool:
    """Make vLLM copy memtrace's switches to Ray workers (in ``environ``, default this process's);
    True when the variable changed."""
    environ = os.environ if environ is None else environ
    before = environ.get(PREFIXES_ENV)
    after = prefixes_with_memtrace(before)
    if after == before:
        return False
    environ[PREFIXES_ENV] = after
    return True


class RayClusterHook:
    """A hooks.Handler around ``initialize_ray_cluster``: start the run's collector once Ray is up."""

    key = RAY_CLUSTER_TARGET

    def before(self, target: Any, args: tuple, kwargs: dict) -> Any:
        return True

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if error is not None:
            return
        from ..capture import ray_gather

        try:
            ray_gather.start_collector()
        except Exception as exc:  # noqa: BLE001 - vLLM goes on; workers on other nodes keep their traces
            log.warning(
                "memtrace: no trace collector on the driver's node (%s: %s); Ray workers on other nodes write "
                "their traces on their own disk",
                type(exc).__name__,
                exc,
            )
