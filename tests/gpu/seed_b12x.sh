#!/usr/bin/env bash
# The seed's b12x workspaces on the lent H200, FlashInfer 0.6.13 then 0.7.x, and memtrace diff of them.
#   bash tests/gpu/seed_b12x.sh        # from the repo root, on the device; writes to $OUT
# Needs: the vLLM 0.25.1 set staged in /tmp/stage (../shared/device/README.md: 17 chunk calls), and,
# for 0.7.x, `.whl/slim` carried (flashinfer-python 0.7.4 without its 54 MB of JIT sources, 45 MB:
# the full wheel is 101 MB, over the 64 MiB a call carries). Each step is bounded; the whole fits one call.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f /tmp/site/vllm-env.sh ] || SMOKE=0 bash /tmp/stage/install-on-device.sh > "$OUT/install.log" 2>&1
source /tmp/site/vllm-env.sh
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/site . >> "$OUT/install.log" 2>&1 \
  || { echo "memtrace install failed"; tail -20 "$OUT/install.log"; exit 1; }
export PYTHONUNBUFFERED=1
rm -rf /tmp/seed-0613 /tmp/seed-07x /tmp/seed-07x-shared

echo "== FlashInfer 0.6.13 (vLLM 0.25.1's pin): one wrapper per MoE layer"
timeout 180 python3 tests/gpu/seed_b12x.py --out /tmp/seed-0613 2>&1 | tee "$OUT/seed-0613.log"

if ls .whl/slim/flashinfer_python-0.7.*.whl >/dev/null 2>&1; then
  rm -rf /tmp/site07 && python3 -m pip install -q --no-deps --no-compile --target /tmp/site07 .whl/slim/*.whl \
    > "$OUT/install-07x.log" 2>&1
  echo "== FlashInfer 0.7.x: import check (torch $(python3 -c 'import torch; print(torch.__version__)'))"
  PYTHONPATH=/tmp/site07:$PYTHONPATH timeout 120 python3 -c "
import flashinfer; print('flashinfer', flashinfer.__version__)
from flashinfer.fused_moe.cute_dsl.blackwell_sm12x import moe_dispatch; print('moe_dispatch imports')" \
    2>&1 | tail -5 | tee "$OUT/import-07x.log"
  echo "== FlashInfer 0.7.x: one wrapper per MoE layer, then shared workspaces"
  PYTHONPATH=/tmp/site07:$PYTHONPATH timeout 180 python3 tests/gpu/seed_b12x.py --out /tmp/seed-07x 2>&1 \
    | tee "$OUT/seed-07x.log"
  PYTHONPATH=/tmp/site07:$PYTHONPATH timeout 180 python3 tests/gpu/seed_b12x.py --shared --out /tmp/seed-07x-shared \
    2>&1 | tee "$OUT/seed-07x-shared.log"
  for pair in "seed-0613 seed-07x" "seed-0613 seed-07x-shared" "seed-07x seed-07x-shared"; do
    set -- $pair
    [ -d "/tmp/$1" ] && [ -d "/tmp/$2" ] || continue
    echo "== memtrace diff $1 $2 --fail-over 2%"
    python3 -m memtrace diff "/tmp/$1" "/tmp/$2" --fail-over 2% > "$OUT/diff-$1-$2.txt" 2>&1
    echo "exit $?"; grep -E "FAIL|OK:|total|hooked" "$OUT/diff-$1-$2.txt" | head -20
  done
else
  echo "no .whl/slim/flashinfer_python-0.7.*.whl carried: 0.7.x skipped"
fi
tar czf "$OUT/seed-runs.tar.gz" -C /tmp $(cd /tmp && ls -d seed-0613 seed-07x seed-07x-shared 2>/dev/null)
