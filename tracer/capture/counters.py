"""The caching allocator's counters, read once: the drains, the serving window, the sidecar's hint and the vLLM
plugin's phase edges all read through :func:`allocator_stats`. Light on purpose (no numpy, no trace model): the
vLLM plugin imports it at registration, on vLLM's thread."""

from __future__ import annotations

from typing import Any


def allocator_stats(torch: Any, device: int) -> dict[str, Any]:
    """The caching allocator's nested counters (``stats["reserved_bytes"]["all"]["current"]``) in one read of
    ``torch._C._cuda_memoryStats``; a torch without it: ``memory_stats()``' flat names nested the same way (that
    reader flattens every counter, ~5x slower)."""
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:
        return raw(device)
    out: dict[str, Any] = {}
    for name, value in torch.cuda.memory_stats(device).items():
        *parents, leaf = name.split(".")
        d = out
        for p in parents:
            d = d.setdefault(p, {})
        d[leaf] = value
    return out


def stat(stats: dict[str, Any], name: str, default: int | None = None) -> int | None:
    """The counter ``name`` ("reserved_bytes.all.current") of :func:`allocator_stats`; ``default`` where absent."""
    node: Any = stats
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return int(node)
