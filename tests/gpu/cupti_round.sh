#!/usr/bin/env bash
# Issue 15 on the lent H200, ONE device call: the CUPTI source checked alone, then a real vLLM 0.25.1
# start-up recorded with it. From the repo root on the device, the 17 chunk folders copied to /tmp/stage
# (or /tmp/site installed by an earlier call), carrying .whlcupti (cupti-python 13.0.1, pyelftools 0.33):
#   bash tests/gpu/cupti_round.sh
# or the check, then the plugin's cost with and without CUPTI (a warm-up run fills the compile cache),
# continued in a second call on the same warm machine:
#   STEPS=cost MODES="on off cupti" PAIRS=1 WARMUP=1 bash tests/gpu/cupti_round.sh
#   STEPS=cost MODES="on off cupti" PAIRS=2 FIRST_ROUND=2 bash tests/gpu/vllm_round2.sh
# Files back in $OUT: check-cupti.log (tests/gpu/check_cupti.py --cost: one JSON line, PASS/FAIL) and
# vllm_round2.sh's progress.log, install.log, trace.tar.gz.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LIMIT=${LIMIT:-570}
rm -rf /tmp/cupti /tmp/mt
python3 -m pip install -q --no-index --no-deps --target /tmp/cupti .whlcupti/*.whl > "$OUT/check-cupti.log" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/mt . >> "$OUT/check-cupti.log" 2>&1
MEMTRACE_CUPTI_STACKS=1 PYTHONPATH=/tmp/cupti:/tmp/mt timeout -s KILL 200 python3 tests/gpu/check_cupti.py --cost --timeout 150 >> "$OUT/check-cupti.log" 2>&1
echo "check_cupti exit $? at ${SECONDS}s" | tee -a "$OUT/check-cupti.log"
tail -3 "$OUT/check-cupti.log" | cut -c1-3000
CUPTI=1 STEPS=${STEPS:-trace} LIMIT=$((LIMIT - SECONDS)) bash tests/gpu/vllm_round2.sh
