"""The text rendering of ``memtrace fits`` (analysis.fits results): one paragraph for one capacity,
a table for several."""

from __future__ import annotations

from ..units import format_gib as _gib


def _verdict(r) -> str:
    if r.outcome == "unknown":
        return "unknown: the recording ends before the KV cache (record a run that gets further)"
    if r.survives:
        return f"fits, {_gib(r.headroom_bytes)} to spare"
    if r.stage == "init":
        return f"vLLM refuses at init_device: free memory {_gib(r.overshoot_bytes)} short of util × capacity"
    if r.stage == "KV sizing" and "max_model_len" in r.phase:
        return f"vLLM refuses: KV cache {_gib(r.kv_cache_bytes)} < one max_model_len request ({_gib(r.overshoot_bytes)} short)"
    if r.stage == "KV sizing":
        return f"vLLM refuses: no memory for the KV cache ({_gib(r.overshoot_bytes)} short)"
    if r.stage == "pre-KV":
        return f"OOM in {r.phase} (before KV sizing; needs {_gib(r.overshoot_bytes)} more)"
    return f"OOM in {r.phase} (after the KV cache; {_gib(r.overshoot_bytes)} over)"


def render_fits(results: list, run_path: str, smallest: int | None, non_torch: str = "") -> str:
    """The text answer: one paragraph for one capacity, a table for several."""
    lines = [f"memtrace fits: {run_path}"]
    if len(results) == 1:
        r = results[0]
        lines.append(
            f"On a {_gib(r.capacity_bytes)} card at --gpu-memory-utilization {r.util:g} "
            f"(vLLM may fill {_gib(r.target_bytes)}):"
        )
        if r.survives:
            lines.append(
                f"  SURVIVES: KV cache {_gib(r.kv_cache_bytes)}, {_gib(r.headroom_bytes)} to spare at the tightest moment"
            )
        elif r.stage == "pre-KV":
            lines.append(f"  DIES in {r.phase}, before the KV cache is sized:")
            lines.append(
                f"  before the KV cache it needs {_gib(r.pre_kv_peak_bytes)} (peak in {r.pre_kv_peak_phase}), "
                f"{_gib(r.overshoot_bytes)} more than the card; --gpu-memory-utilization cannot help"
            )
        elif r.stage == "init":
            lines.append(
                f"  REFUSED at init_device: vLLM needs {_gib(r.target_bytes)} free at start-up and would find "
                f"{_gib(r.overshoot_bytes)} less (CUDA context and other memory); lower --gpu-memory-utilization"
            )
        elif r.stage == "KV sizing" and "max_model_len" in r.phase:
            lines.append(
                f"  DIES at KV sizing: the {_gib(r.kv_cache_bytes)} KV cache cannot hold one request of max_model_len "
                f"tokens ({_gib(r.overshoot_bytes)} short); lower --max-model-len or raise --gpu-memory-utilization"
            )
        elif r.stage == "KV sizing":
            lines.append(
                f"  DIES at KV sizing: vLLM counts {_gib(r.non_kv_bytes)} that is not KV cache, "
                f'{_gib(r.overshoot_bytes)} more than it may fill ("No available memory for the cache blocks")'
            )
        else:
            lines.append(f"  DIES in {r.phase}, after the KV cache ({_gib(r.kv_cache_bytes)}) was allocated:")
            lines.append(
                f"  the post-KV peak would be {_gib(r.post_kv_peak_bytes)}, {_gib(r.overshoot_bytes)} over the card"
            )
        lines.append(
            f"  card-independent: {_gib(r.non_kv_bytes)} non-KV; pre-KV peak {_gib(r.pre_kv_peak_bytes)} in {r.pre_kv_peak_phase}"
        )
    else:
        head = f"  {'capacity':>10} {'util':>5} {'vLLM fills':>11} {'non-KV':>10} {'KV cache':>10} {'post-KV peak':>13}  outcome"
        lines.append(head)
        for r in results:
            kv = _gib(r.kv_cache_bytes) if r.kv_cache_bytes > 0 else "none"
            lines.append(
                f"  {_gib(r.capacity_bytes):>10} {r.util:>5g} {_gib(r.target_bytes):>11} {_gib(r.non_kv_bytes):>10} "
                f"{kv:>10} {_gib(r.post_kv_peak_bytes):>13}  {_verdict(r)}"
            )
        r = results[0]
        lines.append(f"  pre-KV peak (every card): {_gib(r.pre_kv_peak_bytes)} in {r.pre_kv_peak_phase}")
    if non_torch:
        lines.append(f"Non-PyTorch memory (CUDA context, libraries) assumed: {non_torch}; --non-torch SIZE to change")
    if smallest is not None:
        lines.append(f"Smallest card this start-up fits on at that utilization: about {_gib(smallest)}")
    return "\n".join(lines) + "\n"
