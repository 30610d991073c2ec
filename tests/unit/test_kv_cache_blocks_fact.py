"""``vllm.kv_cache_blocks`` means the KV cache blocks vLLM sized, on every vLLM 0.34 start-up shipped: for the
extensible KV cache the blocks it committed, 0 when vLLM refused to start, never the address range's capacity.

The H200 start-ups were recorded by a plugin that kept the range's capacity when vLLM never extended the cache
(``small-r2048``: 264,297 blocks for a start-up vLLM refused with 0); the store reads such a trace's facts as
they mean now (``facts.with_committed_kv_cache``), and the plugin records them so (test_plugin_vllm_034_flow).
Every figure is compared with vLLM's own log line.
"""

from __future__ import annotations

import fits_check as FC
import pytest
from memtrace import facts as F
from memtrace.store import load_run
from vllm034_data import VLLM034
from whatif_heldout_cases import GRID

WARMUP = r"Memory after warmup: .*?; (\d+) KV cache blocks"


def _facts(src, step: str) -> dict:
    return load_run(src.run_dir(step)).traces[0].facts


def test_a_refused_extensible_start_up_has_the_zero_blocks_vllm_sized_not_the_address_range():
    f = _facts(GRID, "small-r2048")
    assert int(GRID.logged("small-r2048", WARMUP)) == 0  # vLLM: "0 KV cache blocks (0.0 GiB) fit"
    assert "No available memory for the cache blocks" in GRID.vllm_log("small-r2048")
    sizing = f[F.VLLM_KV_SIZING]
    assert sizing["capacity_blocks"] == 264_297  # the range: what the fact held before
    assert f[F.VLLM_KV_BLOCKS] == 0 and f[F.VLLM_KV_TOKENS] == 0
    assert f[F.VLLM_KV_BYTES] == sizing["committed_bytes"] == 33_554_432  # vLLM: "0.03 GiB committed"
    assert F.kv_tokens_per_block(f) == 64  # the configured block size, the blocks being 0
    assert FC.measured_blocks(load_run(GRID.run_dir("small-r2048")).traces[0]) == 0


@pytest.mark.parametrize(
    "src, step", [(GRID, "g03"), (GRID, "g07"), (GRID, "g08"), (VLLM034, "moe-ext"), (VLLM034, "small-ext")]
)
def test_a_booted_extensible_start_up_keeps_the_blocks_vllm_extended_its_cache_to(src, step):
    f = _facts(src, step)
    extended = int(src.logged(step, r"Extended KV cache to (\d+) blocks"))
    assert f[F.VLLM_KV_BLOCKS] == extended == int(src.logged(step, WARMUP)) == f[F.VLLM_KV_SIZING]["num_blocks"]
    assert f[F.VLLM_KV_TOKENS] == extended * 64
    assert f[F.VLLM_KV_BYTES] == f[F.VLLM_EXTENSIBLE_KV]["physical_bytes"]
    assert F.with_committed_kv_cache(f) is f  # what the plugin writes now is left as it is


def test_an_older_traces_extensible_range_is_dropped_when_the_cache_was_never_sized():
    old = {
        F.VLLM_KV_SIZE_SOURCE: F.KV_SIZED_EXTENSIBLE,
        F.VLLM_KV_BLOCKS: 264_297,
        F.VLLM_KV_TOKENS: 16_915_008,
        F.VLLM_KV_BYTES: 138_567_745_536,
        F.VLLM_KV_SIZING: {"capacity_blocks": 264_297},  # the recording ended in warm-up, before the sizing
    }
    now = F.with_committed_kv_cache(old)
    assert (F.VLLM_KV_BLOCKS in now, F.VLLM_KV_TOKENS in now, F.VLLM_KV_BYTES in now) == (False, False, False)
    profiled = {F.VLLM_KV_SIZE_SOURCE: F.KV_SIZED_BY_PROFILING, F.VLLM_KV_BLOCKS: 239_986}
    assert F.with_committed_kv_cache(profiled) is profiled
