#!/usr/bin/env bash
# Issue 11, round 2 on the lent H200 — ONE device call (~9 min), everything written under $OUT:
#   (a) trace  : a real vLLM 0.25.1 start-up under `memtrace run`, MEMTRACE_STACKS=python, MEMTRACE_UNTIL=startup
#                (cold: it also fills the compile cache the later steps reuse); trace size checked (<= 2 MB)
#   (b) shared : a plain torch process holds HOLD_GIB (128) GiB, then vLLM at --gpu-memory-utilization 0.07
#                under `memtrace run` dies in profile_run; its trace, the holder's pid, NVML per-process samples
#   (c) cost   : PAIRS warm pairs, plugin on (MEMTRACE_DIR) / off (memtrace installed, idle), alternating
#                with the order swapped each pair, same compile cache; vLLM's "init engine (...) took X s"
#                lines; every run is stopped as soon as that line appears (the API server's own start is
#                not measured)
# Run from the repo root on the device, after the 17 chunk folders were copied to /tmp/stage
# (shared/device/README.md) or with /tmp/site already installed on a warm machine:
#   bash tests/gpu/vllm_round2.sh                      # all three steps, 3 pairs if time allows
#   STEPS=cost PAIRS=3 bash tests/gpu/vllm_round2.sh   # a second call on the same warm machine
#   CUPTI=1 STEPS=trace bash tests/gpu/vllm_round2.sh   # (a) with the CUPTI source (carry .whlcupti)
#   STEPS=cost MODES="on off cupti" bash tests/gpu/vllm_round2.sh   # the plugin's cost with and without CUPTI
# Knobs: STEPS (trace,shared,cost), PAIRS (3 rounds), MODES ('on off'), FIRST_ROUND (1), WARMUP (0), CUPTI (0), LIMIT (seconds for the script, 560), HOLD_GIB (128),
#        SHARED_UTIL (0.07), PORT (base port, 8781).
# Files back in $OUT (<= 8): progress.log, install.log, trace.tar.gz, shared.tar.gz, cost.tar.gz,
# cost-pairs.tsv. The model is the 8-layer Qwen3-MoE of tests/data/vllm-h200/record.sh.
set -uo pipefail   # no -e: every step reports its own failure and the script goes on to the next
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LIMIT=${LIMIT:-560}
PAIRS=${PAIRS:-3}
FIRST_ROUND=${FIRST_ROUND:-1}   # a later call continues the numbering (and the order's rotation)
WARMUP=${WARMUP:-0}     # 1: one uncounted run (plugin off) first, to fill a cold compile cache
MODES=${MODES:-on off}   # cost modes per round: on (plugin), off (installed, idle), cupti (plugin + CUPTI)
CUPTI=${CUPTI:-0}       # 1: the (a) trace is recorded with MEMTRACE_CUPTI=1 MEMTRACE_CUPTI_STACKS=1
STEPS=${STEPS:-trace,shared,cost}
HOLD_GIB=${HOLD_GIB:-128}
SHARED_UTIL=${SHARED_UTIL:-0.07}
PORT=${PORT:-8781}
W=/tmp/vr2                      # work folder; the session ids of everything started are in $W/sids
INIT_RE='init engine \(profile, create kv cache, warmup model\) took [0-9.]+'

# shellcheck source=tests/gpu/session_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/session_lib.sh"

pack() {  # the step folders as tarballs in $OUT (called after each step and at exit)
  local s
  for s in trace shared cost; do [ -d "$W/$s" ] && tar czf "$OUT/$s.tar.gz" -C "$W" "$s" 2>/dev/null; done
  [ -f "$W/cost/pairs.tsv" ] && cp "$W/cost/pairs.tsv" "$OUT/cost-pairs.tsv"
  return 0
}

finish() { trap - EXIT INT TERM; cleanup_all; pack; log "done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"; }
trap finish EXIT
trap 'log "interrupted"; exit 130' INT TERM

# ---- set-up -------------------------------------------------------------------------------------
mkdir -p "$W"
cleanup_all   # servers left over by an earlier call on this machine
rm -rf "$W/trace" "$W/shared" "$W/cost"
log "round 2: STEPS=$STEPS PAIRS=$PAIRS LIMIT=${LIMIT}s HOLD_GIB=$HOLD_GIB SHARED_UTIL=$SHARED_UTIL"
SITE_ENV=${SITE_ENV:-/tmp/site/vllm-env.sh}   # (a knob only for trying the script off the device)
if [ ! -f "$SITE_ENV" ]; then
  [ -f /tmp/stage/install-on-device.sh ] || { log "no /tmp/site and no /tmp/stage: copy the 17 chunk folders first"; exit 1; }
  SMOKE=0 bash /tmp/stage/install-on-device.sh > "$OUT/install.log" 2>&1
fi
source "$SITE_ENV"
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/site . >> "$OUT/install.log" 2>&1 \
  || { log "memtrace install failed"; tail -20 "$OUT/install.log"; exit 1; }
if [ "$CUPTI" = 1 ] || [[ " $MODES " == *" cupti "* ]]; then   # cupti-python + pyelftools, carried as wheels
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whlcupti/*.whl >> "$OUT/install.log" 2>&1 \
    || { log "cupti-python install failed (carry .whlcupti)"; tail -5 "$OUT/install.log"; exit 1; }
fi
export PYTHONUNBUFFERED=1 VLLM_CACHE_ROOT=/tmp/vcache HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
unset VLLM_PLUGINS MEMTRACE MEMTRACE_DIR MEMTRACE_UNTIL MEMTRACE_STACKS MEMTRACE_HOOKS MEMTRACE_FAULT
python3 -c "import vllm, torch, memtrace; print('vllm', vllm.__version__, 'torch', torch.__version__, 'memtrace', memtrace.__file__)" 2>&1 | tee -a "$OUT/progress.log"
log "GPU at start (compute apps / memory):"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1 | tee -a "$OUT/progress.log"
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$OUT/progress.log"
log "installed; compile cache: $(du -sh /tmp/vcache 2>/dev/null | cut -f1 || echo none)"

mkdir -p /tmp/model && cp tests/data/vllm-h200/model-config.json /tmp/model/config.json   # the model of record.sh
# the flags of tests/data/vllm-h200/record.sh; the port is added per run
VLLM=(python3 -m vllm.entrypoints.openai.api_server --model /tmp/model --load-format dummy --skip-tokenizer-init
      --host 127.0.0.1 --kv-cache-dtype fp8 --max-model-len 32768 --max-num-batched-tokens 8192 --max-num-seqs 8
      --api-key memtrace-secret-key)
NEXT_PORT=$PORT
next_port() { NEXT_PORT=$((NEXT_PORT + 1)); }   # a fresh port per server (not in a $(...): that is a subshell)
vllm_facts() {  # the lines of vLLM's log that must not change with the plugin
  grep -hoE "Available KV cache memory: [0-9.]+ GiB|GPU KV cache size: [0-9,]+ tokens|Model loading took [0-9.]+ GiB|$INIT_RE s( \(compilation: [0-9.]+ s\))?" "$1" | tr '\n' ';'
}
smi_start() {  # device-level NVML samples at 10 Hz into FILE
  start /dev/null nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader,nounits -lms 100 -f "$1"
  SMI=$SID
}

# ---- (a) a real start-up, traced with Python stacks ---------------------------------------------
if want trace; then
  mkdir -p "$W/trace"; D=$W/trace
  log "(a) trace: cold start-up under memtrace run, MEMTRACE_STACKS=python (limit $(left)s left)"
  smi_start "$D/nvidia-smi.csv"; next_port
  CUPTI_ENV=(); [ "$CUPTI" = 1 ] && CUPTI_ENV=(MEMTRACE_CUPTI=1 MEMTRACE_CUPTI_STACKS=1)
  start "$D/vllm.log" env "${CUPTI_ENV[@]}" PYTHONFAULTHANDLER=1 MEMTRACE_STACKS=python python3 -m memtrace run --dir "$D/run" --until startup -- \
    "${VLLM[@]}" --port "$NEXT_PORT" --gpu-memory-utilization 0.92
  A=$SID
  wait_log "$D/vllm.log" "Application startup complete" "$A" $(( $(left) > 400 ? 360 : $(left) - 30 ))
  rc=$?
  log "(a) startup-complete wait: $([ $rc = 0 ] && echo seen || ([ $rc = 1 ] && echo 'server died' || echo 'TIMED OUT'))"
  if [ $rc = 2 ]; then   # stuck: every Python thread's stack into vllm.log (PYTHONFAULTHANDLER=1), then stop
    session_pids "$A" | xargs -r kill -ABRT 2>/dev/null; sleep 3
    grep -B2 -A25 "most recent call first" "$D/vllm.log" | cut -c1-200 | head -150 | tee -a "$OUT/progress.log"
  fi
  wait_log "$D/vllm.log" "memtrace: start-up complete" "$A" 30 && sleep 8   # memtrace run's summary follows
  stop_session "$A"; stop_session "$SMI" 2
  grep -E "memtrace|Available KV|KV cache size|Model loading took|init engine|Graph capturing|Error|Traceback" "$D/vllm.log" | cut -c1-300 | head -40 | tee -a "$OUT/progress.log"
  for f in "$D"/run/*.memtrace; do
    [ -f "$f" ] || { log "(a) NO TRACE FILE"; continue; }
    size=$(stat -c %s "$f")
    log "(a) trace $(basename "$f"): $size B $([ "$size" -le 2000000 ] && echo '<= 2 MB: OK' || echo '> 2 MB: TOO BIG to ship')"
    ls "$f"-wal >/dev/null 2>&1 && log "(a) WARNING: a -wal file is left beside the trace (writer not closed)"
  done
  timeout 60 python3 -m memtrace report "$D/run" > "$D/report.txt" 2>&1; log "(a) report exit $?"
  head -30 "$D/report.txt" | tee -a "$OUT/progress.log"
  pack; log "(a) done"
fi

# ---- (b) a shared GPU: another process holds HOLD_GIB GiB ---------------------------------------
if want shared && [ "$(left)" -ge 100 ]; then
  mkdir -p "$W/shared"; D=$W/shared
  log "(b) shared: holder takes ${HOLD_GIB} GiB, then vLLM at util $SHARED_UTIL (limit $(left)s left)"
  cat > "$D/holder.py" <<'PY'
"""Hold N GiB of the GPU until killed (the 'other process' of a shared GPU)."""
import os, sys, time
import torch
n = int(float(sys.argv[1]) * 2**30)
x = torch.empty(n, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
with open(sys.argv[2], "w") as f:
    f.write(f"{os.getpid()}\n")
print(f"holder pid {os.getpid()} holds {n} B; cudaMemGetInfo free {free} B of {total} B; "
      f"reserved {torch.cuda.memory_reserved()} B", flush=True)
while True:
    time.sleep(1)
PY
  start "$D/holder.log" python3 "$D/holder.py" "$HOLD_GIB" "$D/holder.pid"
  H=$SID
  if wait_log "$D/holder.log" "holder pid" "$H" 90; then
    cat "$D/holder.log" | tee -a "$OUT/progress.log"
    start /dev/null bash -c "while :; do echo \"# \$(date +%s.%N)\"; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits; sleep 0.5; done > '$D/nvidia-smi-apps.txt' 2>&1"
    APPS=$SID
    smi_start "$D/nvidia-smi.csv"; next_port
    start "$D/vllm.log" python3 -m memtrace run --dir "$D/run" --until startup -- \
      "${VLLM[@]}" --port "$NEXT_PORT" --gpu-memory-utilization "$SHARED_UTIL"
    B=$SID
    wait_end "$B" $(( $(left) > 200 ? 180 : $(left) - 15 )); rc=$?
    log "(b) vLLM $([ $rc = 0 ] && echo exited || echo 'still running: stopping it')"
    stop_session "$B" 10; stop_session "$APPS" 2; stop_session "$SMI" 2
    log "(b) holder pid (its own os.getpid): $(cat "$D/holder.pid" 2>/dev/null); NVML's compute apps while vLLM ran:"
    grep -v '^#' "$D/nvidia-smi-apps.txt" | sort | uniq -c | sort -rn | head -8 | tee -a "$OUT/progress.log"
    grep -E "memtrace|OutOfMemory|Tried to allocate|Process [0-9]+ has|Error|Traceback|File \"" "$D/vllm.log" | cut -c1-300 | head -60 | tee -a "$OUT/progress.log"
    log "(b) memtrace frames in vLLM's OOM traceback: $(grep -c 'memtrace/plugins/hooks.py' "$D/vllm.log") (expect 1 per traceback print); traceback prints: $(grep -c 'Traceback (most recent call last)' "$D/vllm.log")"
    ls -la "$D/run" 2>&1 | tee -a "$OUT/progress.log"
    timeout 60 python3 -m memtrace report "$D/run" > "$D/report.txt" 2>&1; log "(b) report exit $?"
    head -40 "$D/report.txt" | tee -a "$OUT/progress.log"
  else
    log "(b) the holder did not start:"; tail -20 "$D/holder.log" | tee -a "$OUT/progress.log"
  fi
  stop_session "$H" 5
  pack; log "(b) done"
elif want shared; then
  log "(b) skipped: $(left)s left"
fi

# ---- (c) the cost: warm pairs, plugin on / off --------------------------------------------------
one_run() {  # one_run NAME on|off|cupti -> prints the init-engine seconds (or "-") ; logs under $W/cost
  local name=$1 mode=$2 d=$W/cost t0 rc secs
  t0=$SECONDS; next_port
  case $mode in
    on) MEMTRACE_DIR="$d/$name-trace" start "$d/$name.log" "${VLLM[@]}" --port "$NEXT_PORT" --gpu-memory-utilization 0.92 ;;
    cupti) MEMTRACE_DIR="$d/$name-trace" MEMTRACE_CUPTI=1 MEMTRACE_CUPTI_STACKS=1 \
             start "$d/$name.log" "${VLLM[@]}" --port "$NEXT_PORT" --gpu-memory-utilization 0.92 ;;
    *) start "$d/$name.log" "${VLLM[@]}" --port "$NEXT_PORT" --gpu-memory-utilization 0.92 ;;
  esac
  local sid=$SID
  wait_log "$d/$name.log" "$INIT_RE" "$sid" $(( $(left) - 10 )); rc=$?
  stop_session "$sid" 15
  secs=$(grep -oE "$INIT_RE" "$d/$name.log" | head -1 | grep -oE '[0-9.]+$')
  echo "$name	$mode	${secs:--}	$((SECONDS - t0))	$(vllm_facts "$d/$name.log")" >> "$d/runs.tsv"
  log "(c) $name ($mode): init engine ${secs:-not reached (rc $rc)} s; run took $((SECONDS - t0)) s"
  RUN_S=$((SECONDS - t0)); SECS=${secs:--}
}

if want cost; then
  mkdir -p "$W/cost"
  read -r -a MODE_LIST <<< "$MODES"
  NM=${#MODE_LIST[@]}
  log "(c) cost: $PAIRS rounds of ($MODES) (limit $(left)s left; compile cache $(du -sh /tmp/vcache 2>/dev/null | cut -f1))"
  want trace || log "(c) note: no (a) in this call: the first run may pay the cold compile"
  printf 'round\torder' > "$W/cost/pairs.tsv"; for m in "${MODE_LIST[@]}"; do printf '\t%s_s' "$m" >> "$W/cost/pairs.tsv"; done; echo >> "$W/cost/pairs.tsv"
  EST=90   # seconds one warm run is allowed to take before the first is measured
  if [ "$WARMUP" = 1 ]; then one_run warmup off; log "(c) warm-up (not counted) took ${RUN_S}s"; fi
  for ((p = FIRST_ROUND; p < FIRST_ROUND + PAIRS; p++)); do
    if [ "$(left)" -lt $((NM * EST + 15)) ]; then log "(c) stopping before round $p: $(left)s left, a round needs ~$((NM * EST))s"; break; fi
    order=()   # rotate the order each round so no mode always runs first
    for ((k = 0; k < NM; k++)); do order+=("${MODE_LIST[$(( (k + p - 1) % NM ))]}"); done
    declare -A S=()
    for mode in "${order[@]}"; do
      one_run "round$p-$mode" "$mode"; S[$mode]=$SECS
      [ "$RUN_S" -gt "$EST" ] && EST=$RUN_S
    done
    printf '%s\t%s' "$p" "$(IFS=-; echo "${order[*]}")" >> "$W/cost/pairs.tsv"
    for m in "${MODE_LIST[@]}"; do printf '\t%s' "${S[$m]}" >> "$W/cost/pairs.tsv"; done; echo >> "$W/cost/pairs.tsv"
    pack
  done
  log "(c) init engine seconds per round (warm, same compile cache /tmp/vcache):"
  column -t "$W/cost/pairs.tsv" 2>/dev/null | tee -a "$OUT/progress.log" || cat "$W/cost/pairs.tsv"
  python3 - "$W/cost/pairs.tsv" <<'PY' 2>&1 | tee -a "$OUT/progress.log"
import statistics, sys
lines = open(sys.argv[1]).read().splitlines()
modes = [c[: -len("_s")] for c in lines[0].split("\t")[2:]]
rows = [dict(zip(modes, line.split("\t")[2:])) for line in lines[1:]]
for m in modes:
    if m == "off":
        continue
    ok = [(float(r[m]), float(r["off"])) for r in rows if r.get(m, "-") != "-" and r.get("off", "-") != "-"]
    if ok:
        a, b = zip(*ok)
        print(f"{m} vs off, {len(ok)} rounds: median {statistics.median(a):.2f} s vs {statistics.median(b):.2f} s, "
              f"median ratio {statistics.median(x / y for x, y in ok):.3f}, "
              f"median difference {statistics.median(x - y for x, y in ok):+.2f} s")
    else:
        print(f"{m} vs off: no complete round")
PY
  log "(c) vLLM's figures per run (must be equal with and without the plugin):"
  cut -f1,2,5 "$W/cost/runs.tsv" | tee -a "$OUT/progress.log"
  pack; log "(c) done"
fi
