#!/usr/bin/env bash
# Record the real traces in this folder on the lent H200 (vLLM 0.25.1 + FlashInfer 0.6.13, carried as
# ../../../../shared/device/README.md says; the 17 chunk folders must already be copied to /tmp/stage).
#   bash tests/data/vllm-h200/record.sh        # from the repo root, on the device; writes to $OUT
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LIMIT=${LIMIT:-540}   # seconds for the whole script (the device call allows 600)
HERE=tests/data/vllm-h200
[ -f /tmp/site/vllm-env.sh ] || SMOKE=0 bash /tmp/stage/install-on-device.sh > "$OUT/install.log" 2>&1
source /tmp/site/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/site . >> "$OUT/install.log" 2>&1 || { echo "memtrace install failed"; tail -20 "$OUT/install.log"; exit 1; }
export PYTHONUNBUFFERED=1 VLLM_CACHE_ROOT=/tmp/vcache HF_HUB_OFFLINE=1
echo "installed at ${SECONDS}s"

# 1. FlashInfer's real allocator with memtrace's hook, inside a memtrace session (SKIP_PROBE=1 skips it)
if [ "${SKIP_PROBE:-0}" != 1 ]; then
rm -rf /tmp/fi-run
timeout 120 python3 "$HERE/flashinfer_probe.py" /tmp/fi-run > "$OUT/flashinfer-probe.log" 2>&1
grep -E "HOOKCALL|expected|patched|Error" "$OUT/flashinfer-probe.log"
tar czf "$OUT/flashinfer-run.tar.gz" -C /tmp fi-run 2>/dev/null
echo "probe done at ${SECONDS}s"
fi

# 2. vLLM start-up of a real-architecture Qwen3-MoE (dummy weights) with the plugin
mkdir -p /tmp/model && cp "$HERE/model-config.json" /tmp/model/config.json   # 8-layer Qwen3-MoE, real architecture
nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader,nounits -lms 100 > "$OUT/nvidia-smi.csv" 2>/dev/null &
SMI=$!
rm -rf /tmp/vrun
MEMTRACE_DIR=/tmp/vrun MEMTRACE_STACKS=${MEMTRACE_STACKS:-python} setsid python3 -m vllm.entrypoints.openai.api_server \
  --model /tmp/model --load-format dummy --skip-tokenizer-init --host 127.0.0.1 --port 8771 \
  --kv-cache-dtype fp8 --max-model-len 32768 --max-num-batched-tokens 8192 --max-num-seqs 8 \
  --gpu-memory-utilization 0.92 --api-key memtrace-secret-key > "$OUT/vllm.log" 2>&1 &
PID=$!
while kill -0 $PID 2>/dev/null && ! grep -q "Application startup complete" "$OUT/vllm.log" && [ $SECONDS -lt $LIMIT ]; do sleep 2; done
echo "vLLM: $(grep -c 'Application startup complete' "$OUT/vllm.log") startup-complete lines at ${SECONDS}s"
kill -TERM -$PID 2>/dev/null; for i in $(seq 1 30); do kill -0 $PID 2>/dev/null || break; sleep 1; done
kill -KILL -$PID 2>/dev/null; wait $PID; echo "vLLM exit code $?"
kill $SMI 2>/dev/null
grep -E "memtrace|Available KV cache|KV cache size|Model loading took|init engine|CUDA graph|Graph capturing|Error" "$OUT/vllm.log" | head -40
ls -la /tmp/vrun
for f in /tmp/vrun/*.memtrace; do python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')" "$f"; done
tar czf "$OUT/vllm-run.tar.gz" -C /tmp vrun
ls -la "$OUT"; echo "done at ${SECONDS}s"
