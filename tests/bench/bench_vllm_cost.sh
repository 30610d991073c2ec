#!/usr/bin/env bash
# The plugin's cost on vLLM's start-up, on a GPU machine with vLLM installed (the lent H200: see
# tests/gpu/vllm_round2.sh for the set-up): warm pairs of `vllm serve` with and without the plugin,
# alternating order, same compile cache; prints vLLM's own "init engine (profile, create kv cache,
# warmup model) took X s" per run, the pairs, the median ratio (goal <= 1.02) and vLLM's KV figures per
# run (they must not change with the plugin).
#   PAIRS=3 bash tests/bench/bench_vllm_cost.sh        # from the repo root; results under $OUT (or /tmp/out)
# Measured 2026-12-02 on the H200 (tests/data/vllm-h200/cost-pairs.tsv): median ratio 0.88, pairs
# 8.47/23.88, 7.41/7.57, 7.72/8.77 s (with/without; the first run without paid a one-off 15 s).
set -uo pipefail
cd "$(dirname "$0")/../.."
STEPS=cost PAIRS=${PAIRS:-3} exec bash tests/gpu/vllm_round2.sh
