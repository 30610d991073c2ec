#!/usr/bin/env bash
# Real vLLM 0.34 (or 0.33) start-ups on the lent H200, traced by memtrace — one device call, files in $OUT.
# Run from the repo root after the stage folders were copied to /tmp/stage (tests/gpu/vllm034/README.md):
#   STEPS=moe-ext,moe-noext bash tests/gpu/vllm034/startups.sh
# Steps (any order, comma-separated; each one start-up, traced under `memtrace run` with Python stacks):
#   moe-ext      8-layer Qwen3-MoE (tests/data/vllm-h200/model-config.json), vLLM's defaults: extensible KV cache, util 1.0
#   moe-noext    the same with --no-enable-extensible-kv-cache (util defaults to 0.92)
#   moe-092      the same as moe-ext with --gpu-memory-utilization 0.92 (the flags of the 0.25.1 traces)
#   dense-ext    32-layer Llama-shaped dense model (tests/gpu/vllm034/dense-config.json), extensible
#   dense-noext  the same without the extensible KV cache
#   small-ext    moe-ext on a "smaller card": a torch process holds HOLD_GIB GiB of the H200 first
#   cost         ROUNDS rounds of warm eager MoE start-ups (COST_FLAGS: --enforce-eager --max-num-batched-tokens 4096),
#                plugin on (MEMTRACE_DIR) / off, order alternating; cost/runs.tsv has each run's self-reported cost
#   cost-dense   one dense start-up with the plugin, the same flags (its self-reported cost in cost/runs.tsv)
#   cost-graphs  start-ups with the plugin, torch.compile and CUDA graphs (COST_GRAPH_FLAGS: --max-num-batched-tokens
#                4096), one per model of COST_GRAPHS (default "moe moe dense": a cold compile, a warm one, dense)
#   grid         the flags grid of issue 28: GRID="name:model:flag,flag;name:model:..." (model moe|dense; flags
#                separated by commas, e.g. g01:moe:--max-num-batched-tokens,2048), each one traced start-up;
#                GRID_TAG=x packs every folder into one grid-x.tar.gz (the 8-file limit of $OUT)
#   small        the same on a smaller card: a holder process leaves SMALL_FREE bytes free (cudaMemGetInfo), or
#                SMALL_FROM=name: the pre-KV device-used peak of that grid run minus SMALL_MARGIN bytes;
#                SMALL="name:model:flags;..." as GRID; run before grid (after it with SMALL_FROM), the holder
#                stopped before the grid's whole-card runs
#   cut          issue 43: CUT="model:free:cand|cand[:ARCH[:RUN]];..." (models: moe, dense, tests/gpu/vllm034/models/
#                <name>.json): a holder leaves free bytes (free: a number), or load_model's peak + free x (profile_run's
#                - load_model's) of the grid run a-<model> (free: a fraction such as 0.4); each cand (flags, commas;
#                "default"; "suggest"/"suggest2": what `fits --suggest` names from the first cand's cut trace, or RUN,
#                with the priors refitted without ARCH and CONFIG for a RUN that lacks its shape) is a traced start-up
#                cut-<model>-<i> beside the holder; entries "model:free:cands:ARCH:RUN:CONFIG"
#   annotations  issue 29: tests/gpu/record_annotations.py under the stage's torch (annotate entries, user metadata)
#   profiler     issue 29: vLLM's own --profiler-config (torch, memory on) around one completion (moe, eager)
#   serving      issue 30: `vllm serve` (moe, extensible KV) under `memtrace run --until serving` beside a holder that
#                leaves SMALL_FREE bytes free (default 24 GiB), a bounded burst from serving_client.py (127.0.0.1)
#                until the engine dies (or SERVE_BURST_S); then `memtrace window` if it still lives, SIGTERM; packs the run.
#                NEIGHBOUR_LEAVE=N: once vLLM is up, another process takes all but N bytes of what is free
#                (a job that starts later on a shared GPU); BURST_ARGS: more serving_client.py burst flags
#   serving-cost issue 30: ROUNDS (>= 3) alternating rounds, plugin in serving mode on / off, the same fixed-rate
#                benchmark (serving_client.py bench: BENCH_REQUESTS at BENCH_RATE/s); serving-cost.json in $OUT
#                (a warm moe start-up takes ~85 s of wall time: 3 rounds need two calls, ROUNDS=2, then
#                FIRST_ROUND=3 ROUNDS=1 on the same warm machine, whose serving-cost.json then holds every round)
#   serving-ab   issue 30, in one call: every configuration of AB ("name:stacks:drain_s;..."; stacks: those kept
#                while serving, MEMTRACE_SERVING_STACKS, start-up's python; "off": no plugin) served at once, each its own `vllm serve` at --gpu-memory-utilization AB_UTIL (0.2), started
#                one after another; then AB_ROUNDS (3) rounds of the same bench (BENCH_REQUESTS at BENCH_RATE/s) against each
#                in turn (the order rotated each round), the others idle; then `memtrace window` (each traced worker
#                writes its window, with memtrace's own cost while serving) before SIGTERM. serving-ab.json in $OUT
# Knobs: STEPS, LIMIT (seconds for the script, 570), ROUNDS (4), FIRST_ROUND (1), HOLD_GIB (96),
#        SITE (/tmp/site034: the installed stage), PORT (8791).
# Every start-up is stopped as soon as memtrace's summary (or vLLM's "init engine" line, for cost runs
# without the plugin) appears. Files back (<= 8): progress.log, install.log, one <step>.tar.gz per step
# (vLLM's log, nvidia-smi at 10 Hz, the run directory, memtrace's report), cost-rounds.tsv.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LIMIT=${LIMIT:-570}
STEPS=${STEPS:-moe-ext}
ROUNDS=${ROUNDS:-4}
FIRST_ROUND=${FIRST_ROUND:-1}
HOLD_GIB=${HOLD_GIB:-96}
SITE=${SITE:-/tmp/site034}
PORT=${PORT:-8791}
W=/tmp/v034
HERE=tests/gpu/vllm034
INIT_RE='init engine \(profile, create kv cache, warmup model\) took [0-9.]+'
# shellcheck source=tests/gpu/session_lib.sh
source tests/gpu/session_lib.sh

pack() {  # each step's folder as a tarball in $OUT (after each step and at exit); with GRID_TAG one tarball
  local d
  if [ -n "${GRID_TAG:-}" ]; then
    tar czf "$OUT/grid-$GRID_TAG.tar.gz" -C "$W" --exclude='*.csv.raw' $(cd "$W" && ls -d */ 2>/dev/null) 2>/dev/null
    return 0
  fi
  for d in "$W"/*/; do d=$(basename "$d"); tar czf "$OUT/$d.tar.gz" -C "$W" "$d" 2>/dev/null; done
  [ -f "$W/cost/rounds.tsv" ] && cp "$W/cost/rounds.tsv" "$OUT/cost-rounds.tsv"
  [ -f "$W/cost/runs.tsv" ] && cp "$W/cost/runs.tsv" "$OUT/cost-runs.tsv"
  return 0
}
finish() { trap - EXIT INT TERM; cleanup_all; pack; log "done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"; }
trap finish EXIT
trap 'log "interrupted"; exit 130' INT TERM

mkdir -p "$W"; cleanup_all
log "vLLM start-ups: STEPS=$STEPS LIMIT=${LIMIT}s"
if [ ! -f "$SITE/vllm-env.sh" ]; then
  [ -f /tmp/stage/install-on-device.sh ] || { log "no $SITE and no /tmp/stage: copy the stage folders first"; exit 1; }
  bash /tmp/stage/install-on-device.sh > "$OUT/install.log" 2>&1 || { log "install failed:"; tail -30 "$OUT/install.log" | tee -a "$OUT/progress.log"; exit 1; }
  log "stage installed"
fi
source "$SITE/vllm-env.sh"
python3 -m pip install -q --no-deps --no-build-isolation --target "$SITE" --upgrade . >> "$OUT/install.log" 2>&1 \
  || { log "memtrace install failed"; tail -20 "$OUT/install.log"; exit 1; }
export PYTHONUNBUFFERED=1 VLLM_CACHE_ROOT=/tmp/vcache034 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
unset VLLM_PLUGINS MEMTRACE MEMTRACE_DIR MEMTRACE_UNTIL MEMTRACE_STACKS MEMTRACE_HOOKS MEMTRACE_FAULT
python3 -c "import vllm, torch, flashinfer, memtrace; print('vllm', vllm.__version__, '| torch', torch.__version__, '| flashinfer', flashinfer.__version__, '| memtrace', memtrace.__file__)" 2>&1 | tee -a "$OUT/progress.log"
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$OUT/progress.log"
log "ready; compile cache: $(du -sh /tmp/vcache034 2>/dev/null | cut -f1 || echo none)"

mkdir -p /tmp/model-moe /tmp/model-dense
cp tests/data/vllm-h200/model-config.json /tmp/model-moe/config.json
cp "$HERE/dense-config.json" /tmp/model-dense/config.json
for f in "$HERE"/models/*.json; do  # more architectures (issue 43): /tmp/model-<name>, a config and dummy weights
  m=$(basename "$f" .json); mkdir -p "/tmp/model-$m"; cp "$f" "/tmp/model-$m/config.json"
done
COMMON=(--load-format dummy --skip-tokenizer-init --host 127.0.0.1 --kv-cache-dtype fp8 --max-model-len 32768
        --max-num-batched-tokens 8192 --max-num-seqs 8 --api-key memtrace-secret-key)
NEXT_PORT=$PORT
next_port() { NEXT_PORT=$((NEXT_PORT + 1)); }
vllm_facts() {  # vLLM's own figures (must not change with the plugin)
  grep -hoE "Available KV cache memory: [0-9.]+ GiB|KV cache size: [0-9,]+ tokens|Extended KV cache to [0-9]+ blocks \([0-9.]+ GiB\)|Model loading took [0-9.]+ GiB|$INIT_RE s" "$1" | tr '\n' ';'
}

# traced NAME MODEL_DIR FLAGS... : one start-up under `memtrace run`, stopped after memtrace's summary
traced() {
  local name=$1 model=$2; shift 2
  local d=$W/$name; rm -rf "$d"; mkdir -p "$d"; next_port
  log "($name) start-up ($(left)s left): $*"
  start /dev/null nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader,nounits -lms 100 -f "$d/nvidia-smi.csv"
  local smi=$SID t0=$SECONDS
  start "$d/vllm.log" env PYTHONFAULTHANDLER=1 MEMTRACE_STACKS=python python3 -m memtrace run --dir "$d/run" --until startup -- \
    python3 -m vllm.entrypoints.openai.api_server --model "$model" --port "$NEXT_PORT" "${COMMON[@]}" "$@"
  local sid=$SID rc
  wait_log "$d/vllm.log" "memtrace: start-up complete|Application startup complete" "$sid" $(( $(left) - 25 )); rc=$?
  log "($name) $([ $rc = 0 ] && echo "ready after $((SECONDS - t0))s" || ([ $rc = 1 ] && echo 'server died' || echo 'TIMED OUT'))"
  if [ $rc = 2 ]; then
    session_pids "$sid" | xargs -r kill -ABRT 2>/dev/null; sleep 3
    grep -B2 -A25 "most recent call first" "$d/vllm.log" | cut -c1-200 | head -80 | tee -a "$OUT/progress.log"
  fi
  wait_log "$d/vllm.log" "memtrace: start-up complete" "$sid" 20 && sleep 5
  stop_session "$sid"; stop_session "$smi" 2
  grep -E "memtrace|Available KV|KV cache size|Extended KV|Memory after warmup|Model loading took|init engine|Error|Traceback" "$d/vllm.log" | cut -c1-400 | head -40 | tee -a "$OUT/progress.log"
  log "($name) vLLM's figures: $(vllm_facts "$d/vllm.log")"
  for f in "$d"/run/*.memtrace; do [ -f "$f" ] && log "($name) trace $(basename "$f"): $(stat -c %s "$f") B"; done
  timeout 90 python3 -m memtrace report "$d/run" > "$d/report.txt" 2>&1; log "($name) report exit $?"
  head -45 "$d/report.txt" | tee -a "$OUT/progress.log"
  pack
}

want moe-ext && traced moe-ext /tmp/model-moe
want moe-noext && [ "$(left)" -gt 120 ] && traced moe-noext /tmp/model-moe --no-enable-extensible-kv-cache
want moe-092 && [ "$(left)" -gt 120 ] && traced moe-092 /tmp/model-moe --gpu-memory-utilization 0.92
want dense-ext && [ "$(left)" -gt 150 ] && traced dense-ext /tmp/model-dense
want dense-noext && [ "$(left)" -gt 120 ] && traced dense-noext /tmp/model-dense --no-enable-extensible-kv-cache

# the holder: another process that leaves only N bytes of the GPU free (a smaller card), until killed
write_holder() {
  cat > "$W/leave.py" <<'PY'
"""Hold all but N bytes of the GPU's free memory until killed (another process on a shared GPU: a smaller card)."""
import os, sys, time
import torch
want = int(sys.argv[1])
free, total = torch.cuda.mem_get_info()
size = free - want
for _ in range(4):  # the first fill loads kernels (lazy module loading: ~92 MiB on the H100 once): measure, then correct
    x = torch.empty(size, dtype=torch.uint8, device="cuda"); x.fill_(1)
    torch.cuda.synchronize(); free, total = torch.cuda.mem_get_info()
    if free == want:
        break
    size += free - want; del x; torch.cuda.empty_cache()
print(f"holder pid {os.getpid()} holds {x.numel()} B; cudaMemGetInfo free {free} B of {total} B (asked {want} B)", flush=True)
while True:
    time.sleep(1)
PY
}
if want small-ext && [ "$(left)" -gt 150 ]; then
  mkdir -p "$W/small-ext-holder"
  cat > "$W/holder.py" <<'PY'
"""Hold N GiB of the GPU until killed (another process on a shared GPU: a smaller card for vLLM)."""
import os, sys, time
import torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda"); x.fill_(1)
torch.cuda.synchronize(); free, total = torch.cuda.mem_get_info()
print(f"holder pid {os.getpid()} holds {x.numel()} B; cudaMemGetInfo free {free} B of {total} B", flush=True)
while True:
    time.sleep(1)
PY
  start "$W/small-ext-holder/holder.log" python3 "$W/holder.py" "$HOLD_GIB"
  H=$SID
  if wait_log "$W/small-ext-holder/holder.log" "holder pid" "$H" 60; then
    cat "$W/small-ext-holder/holder.log" | tee -a "$OUT/progress.log"
    traced small-ext /tmp/model-moe
  else
    log "(small-ext) the holder did not start"; tail -5 "$W/small-ext-holder/holder.log" | tee -a "$OUT/progress.log"
  fi
  stop_session "$H" 5
  cp "$W/small-ext-holder/holder.log" "$W/small-ext/" 2>/dev/null; rm -rf "$W/small-ext-holder"
fi

# ---- grid (issue 28): GRID / SMALL entries, each a traced start-up --------------------------------------
grid_runs() {  # grid_runs "name:model:flags;..." [PREFIX]
  local entry name model flags
  IFS=';' read -ra ENTRIES <<< "$1"
  for entry in "${ENTRIES[@]}"; do
    [ -n "$entry" ] || continue
    IFS=':' read -r name model flags <<< "$entry"
    [ "$(left)" -gt "${GRID_MIN_LEFT:-100}" ] || { log "(grid) no time left for $name ($(left)s)"; continue; }
    IFS=',' read -ra FL <<< "$flags"
    traced "${2:-}$name" "/tmp/model-$model" "${FL[@]}"
  done
}
pre_kv_peak() {  # the largest device-used peak of a traced run's phases before kv_cache_extend (report --json)
  python3 - "$W/$1/run" <<'PY'
import json, subprocess, sys
doc = json.loads(subprocess.run([sys.executable, "-m", "memtrace", "report", "--json", sys.argv[1]], capture_output=True, text=True).stdout)
t = doc["traces"][0]
print(max(p.get("peak_device_used_bytes") or 0 for p in t["phases"] if p["name"] != "kv_cache_extend"))
PY
}
small_runs() {  # SMALL's start-ups beside a holder that leaves SMALL_FREE bytes free (or SMALL_FROM's peak)
  FREE=${SMALL_FREE:-}
  if [ -z "$FREE" ] && [ -n "${SMALL_FROM:-}" ]; then
    P=$(pre_kv_peak "$SMALL_FROM"); FREE=$((P - ${SMALL_MARGIN:-268435456}))
    log "(small) pre-KV device-used peak of $SMALL_FROM: $P B; leaving $FREE B free"
  fi
  write_holder
  mkdir -p "$W/holder"
  start "$W/holder/holder.log" python3 "$W/leave.py" "$FREE"
  H=$SID
  if wait_log "$W/holder/holder.log" "holder pid" "$H" 60; then
    tee -a "$OUT/progress.log" < "$W/holder/holder.log"
    grid_runs "${SMALL:-}" small-
  else
    log "(small) the holder did not start"; tail -5 "$W/holder/holder.log" | tee -a "$OUT/progress.log"
  fi
  stop_session "$H" 5
  pack
}
if [ -n "${SMALL_FROM:-}" ]; then  # the small card is sized from a grid run's peak: the grid runs first
  want grid && grid_runs "${GRID:-}"
  want small && [ "$(left)" -gt 150 ] && small_runs
else  # else the small card's runs first: a rescue to boot is worth more than another grid point
  want small && [ "$(left)" -gt 150 ] && small_runs
  want grid && grid_runs "${GRID:-}"
fi

# ---- cut (issue 43): a card where the default flags die in profile_run, then the rescues tried on it --------
# CUT="model:frac:cand|cand;..." after the grid ran a-<model> on the whole card: a holder leaves
# load_model's device-used peak + frac x (profile_run's peak - load_model's) free; each cand (flags separated by
# commas, "default" for none) is one traced start-up cut-<model>-<i> beside it.
phase_peaks() {  # "L P": load_model's and profile_run's device-used peaks of a traced run (report --json)
  python3 - "$W/$1/run" <<'PY'
import json, subprocess, sys
doc = json.loads(subprocess.run([sys.executable, "-m", "memtrace", "report", "--json", sys.argv[1]], capture_output=True, text=True).stdout)
ph = {p["name"]: p.get("peak_device_used_bytes") or 0 for p in doc["traces"][0]["phases"]}
print(ph.get("load_model", 0), max(ph.get("profile_run", 0), ph.get("determine_available_memory", 0)))
PY
}
suggested() {  # suggested RUN N OUTDIR [PRIORS [CONFIG]]: the flags of `memtrace fits RUN --suggest`'s Nth booting change on
  # the recorded card (its total: the trace's), with PRIORS (a priors file; default the shipped ones)
  local pri=(); [ -n "${4:-}" ] && pri=(--priors "$4"); [ -n "${5:-}" ] && pri+=(--config "$5")
  timeout 120 python3 -m memtrace fits "$1" --capacity "$CARD_TOTAL"B --keep-others --suggest --json "${pri[@]}" \
    > "$3/suggest.json" 2> "$3/suggest.err"
  python3 - "$3/suggest.json" "$2" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1])); n = int(sys.argv[2])
def found(x):
    if isinstance(x, dict):
        if isinstance(x.get("booting"), list):
            yield from x["booting"]
        for v in x.values():
            yield from found(v)
    elif isinstance(x, list):
        for v in x:
            yield from found(v)
b = list(found(doc))
if len(b) < n:
    sys.exit(1)
print(" ".join(b[n - 1]["changes"]))
PY
}
if want cut; then
  write_holder
  CARD_TOTAL=$(python3 -c "import torch; print(torch.cuda.mem_get_info()[1])")
  IFS=';' read -ra CUTS <<< "${CUT:-}"
  for entry in "${CUTS[@]}"; do
    IFS=':' read -r model frac cands leave from config <<< "$entry"
    [ "$(left)" -gt 150 ] || { log "(cut) no time left for $model ($(left)s)"; continue; }
    PRIORS=""
    if [ -n "${leave:-}" ]; then  # leave one architecture out: the priors refitted without the model's own
      PRIORS=$W/priors-no-$model.json; python3 tests/bench/fit_priors.py --leave-out "$leave" --out "$PRIORS" | tee -a "$OUT/progress.log"
    fi
    if [[ "$frac" == *.* ]]; then
      read -r L P <<< "$(phase_peaks "a-$model")"
      [ "${L:-0}" -gt 0 ] && [ "${P:-0}" -gt "$L" ] || { log "(cut) $model: no whole-card run to size the card from (L=$L P=$P)"; continue; }
      FREE=$(python3 -c "print(int($L + $frac * ($P - $L)))")
      log "(cut) $model: load_model peak $L B, profile_run peak $P B; leaving $FREE B free"
    else
      FREE=$frac; log "(cut) $model: leaving $FREE B free"
    fi
    mkdir -p "$W/holder-$model"
    start "$W/holder-$model/holder.log" python3 "$W/leave.py" "$FREE"; H=$SID
    if wait_log "$W/holder-$model/holder.log" "holder pid" "$H" 60; then
      tee -a "$OUT/progress.log" < "$W/holder-$model/holder.log"
      IFS='|' read -ra CANDS <<< "$cands"; i=0
      for c in "${CANDS[@]}"; do
        [ "$(left)" -gt 100 ] || { log "(cut) no time left for $model $c"; break; }
        if [ "$c" = default ]; then FL=()
        elif [[ "$c" == suggest* ]]; then  # what `fits --suggest` names from the first (cut) run alone: suggest, suggest2
          n=${c#suggest}; n=${n:-1}
          S=$(suggested "${from:-$W/cut-$model-0/run}" "$n" "$W" "$PRIORS" "${config:-}") || { log "(cut) $model: fits --suggest gave no suggestion $n: $(tail -2 "$W/suggest.err")"; continue; }
          log "(cut) $model: suggestion $n from the cut trace: $S"; read -ra FL <<< "$S"
        else IFS=',' read -ra FL <<< "$c"; fi
        traced "cut-$model-$i" "/tmp/model-$model" "${FL[@]}"
        [[ "$c" == suggest* ]] && cp "$W/suggest.json" "$W/cut-$model-$i/suggest.json" 2>/dev/null
        cp "$W/holder-$model/holder.log" "$W/cut-$model-$i/" 2>/dev/null; i=$((i + 1))
      done
    else
      log "(cut) the holder did not start"; tail -5 "$W/holder-$model/holder.log" | tee -a "$OUT/progress.log"
    fi
    stop_session "$H" 5; rm -rf "$W/holder-$model"
  done
  pack
fi

# ---- cost: warm rounds, plugin on / off ------------------------------------------------------------
# Each run's vLLM "init engine" and, with the plugin, memtrace's self-reported cost (tests/bench/vllm_cost.py figure)
# go into cost/runs.tsv; `vllm_cost.py analyse` pairs the rounds. A warm eager MoE start-up takes ~40-90 s of wall
# time and a round two of them, so a 570 s call holds ~3-4 rounds: the >= 12 warm pairs of issue 42 (13 rounds,
# round 1 cold) take four calls on the same warm machine (STEPS=cost ROUNDS=4, then FIRST_ROUND=5, 9, 12 with
# ROUNDS=4, 4, 2; $W/cost keeps every round). STEPS=cost-dense: one dense start-up with the plugin (its figure).
COST_FLAGS=(${COST_FLAGS:---enforce-eager --max-num-batched-tokens 4096})  # the g4096-s8-eager flags
one_run() {  # one_run NAME on|off [MODEL_DIR] -> SECS (init engine s), WALL (s to the log line)
  local name=$1 mode=$2 model=${3:-/tmp/model-moe} d=$W/cost t0=$SECONDS rc figure
  next_port
  if [ "$mode" = on ]; then
    MEMTRACE_DIR="$d/$name-trace" start "$d/$name.log" python3 -m vllm.entrypoints.openai.api_server --model "$model" --port "$NEXT_PORT" "${COMMON[@]}" "${COST_FLAGS[@]}"
  else
    start "$d/$name.log" python3 -m vllm.entrypoints.openai.api_server --model "$model" --port "$NEXT_PORT" "${COMMON[@]}" "${COST_FLAGS[@]}"
  fi
  local sid=$SID
  wait_log "$d/$name.log" "Application startup complete" "$sid" $(( $(left) - 10 )); rc=$?
  WALL=$((SECONDS - t0))
  [ "$mode" = on ] && wait_log "$d/$name.log" "memtrace: start-up traced" "$sid" 20
  stop_session "$sid" 15
  SECS=$(grep -oE "$INIT_RE" "$d/$name.log" | head -1 | grep -oE '[0-9.]+$')
  figure=$(printf -- '-\t-\t-\t-')
  [ "$mode" = on ] && { figure=$(python3 tests/bench/vllm_cost.py figure "$d/$name-trace" 2>> "$OUT/progress.log") \
    || figure=$(printf -- '-\t-\t-\t-'); }  # a failed figure keeps the row's columns
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$mode" "${SECS:--}" "$WALL" "$figure" "$(vllm_facts "$d/$name.log")" >> "$d/runs.tsv"
  log "(cost) $name ($mode): init engine ${SECS:-not reached (rc $rc)} s; ready after ${WALL}s; memtrace: $(echo "$figure" | cut -f1,2,4)"
}
cost_files() {
  mkdir -p "$W/cost"
  [ -f "$W/cost/runs.tsv" ] || printf 'run\tplugin\tinit_engine_s\twall_s\tself_ms\tself_pct\thistory_ms\tself_sources\tvllm\n' > "$W/cost/runs.tsv"
}
if want cost; then
  cost_files
  [ -f "$W/cost/rounds.tsv" ] || printf 'round\torder\ton_init_s\toff_init_s\ton_wall_s\toff_wall_s\n' > "$W/cost/rounds.tsv"
  EST=60
  for ((p = FIRST_ROUND; p < FIRST_ROUND + ROUNDS; p++)); do
    [ "$(left)" -lt $((2 * EST + 20)) ] && { log "(cost) stopping before round $p: $(left)s left"; break; }
    if ((p % 2)); then order=(on off); else order=(off on); fi
    declare -A S=() T=()
    for mode in "${order[@]}"; do one_run "round$p-$mode" "$mode"; S[$mode]=${SECS:--}; T[$mode]=$WALL; [ "$WALL" -gt "$EST" ] && EST=$WALL; done
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$p" "${order[0]}-${order[1]}" "${S[on]}" "${S[off]}" "${T[on]}" "${T[off]}" >> "$W/cost/rounds.tsv"
    pack
  done
  { command -v column > /dev/null && column -t "$W/cost/rounds.tsv" || cat "$W/cost/rounds.tsv"; } | tee -a "$OUT/progress.log"  # the H200 image has no column
  python3 tests/bench/vllm_cost.py analyse "$W/cost/runs.tsv" 2>&1 | tee -a "$OUT/progress.log"
fi
if want cost-dense && [ "$(left)" -gt 150 ]; then
  cost_files
  one_run "dense-$(date +%H%M%S)-on" on /tmp/model-dense
  pack
fi
if want cost-graphs; then  # start-ups with vLLM's torch.compile and CUDA graphs (COST_GRAPHS: models, in order)
  cost_files
  EAGER=("${COST_FLAGS[@]}"); COST_FLAGS=(${COST_GRAPH_FLAGS:---max-num-batched-tokens 4096})
  for m in ${COST_GRAPHS:-moe moe dense}; do
    [ "$(left)" -lt 200 ] && { log "(cost) graphs: $(left)s left, not starting $m"; break; }
    one_run "graphs-$m-$(date +%H%M%S)-on" on "/tmp/model-$m"
    pack
  done
  COST_FLAGS=("${EAGER[@]}")
fi

# ---- serving-ab (issue 30): the cost of serving mode, every configuration served at once ----------------------
if want serving-ab; then
  d=$W/ab; rm -rf "$d"; mkdir -p "$d"
  IFS=';' read -ra CFG <<< "${AB:-off:off:0;py-held:python:0;none-held:none:0;py-drain:python:5}"
  declare -A PORTS=() SIDS=()
  for c in "${CFG[@]}"; do
    IFS=':' read -r name stacks drain <<< "$c"; r=$d/$name; mkdir -p "$r"; next_port; PORTS[$name]=$NEXT_PORT
    if [ "$stacks" = off ]; then
      start "$r/vllm.log" python3 -m vllm.entrypoints.openai.api_server --model /tmp/model-moe --port "$NEXT_PORT" \
        "${COMMON[@]}" --gpu-memory-utilization "${AB_UTIL:-0.2}" ${SERVE_FLAGS:-}
    else
      start "$r/vllm.log" env PYTHONFAULTHANDLER=1 MEMTRACE_STACKS=python MEMTRACE_SERVING_STACKS="$stacks" MEMTRACE_SERVING_DRAIN_S="$drain" \
        python3 -m memtrace run --dir "$r/run" --until serving -- python3 -m vllm.entrypoints.openai.api_server \
        --model /tmp/model-moe --port "$NEXT_PORT" "${COMMON[@]}" --gpu-memory-utilization "${AB_UTIL:-0.2}" ${SERVE_FLAGS:-}
    fi
    SIDS[$name]=$SID
    # one at a time: vLLM's profiling counts the device's memory consumed since its init, another server's too
    wait_log "$r/vllm.log" "Application startup complete" "$SID" $(( $(left) - 200 ))
  done
  ready=()
  for c in "${CFG[@]}"; do
    name=${c%%:*}
    if wait_log "$d/$name/vllm.log" "Application startup complete" "${SIDS[$name]}" $(( $(left) - 200 )); then
      ready+=("$name"); log "(ab) $name ready: $(vllm_facts "$d/$name/vllm.log")"
    else
      log "(ab) $name did not start"; grep -E "Error|error" "$d/$name/vllm.log" | tail -5 | cut -c1-300 | tee -a "$OUT/progress.log"
    fi
  done
  n=${#ready[@]}
  for ((p = 0; p < ${AB_ROUNDS:-3}; p++)); do
    for ((i = 0; i < n; i++)); do
      name=${ready[$(( (i + p) % n ))]}
      [ "$(left)" -lt 90 ] && { log "(ab) out of time before round $p $name"; break 2; }
      python3 "$HERE/serving_client.py" bench --port "${PORTS[$name]}" --api-key memtrace-secret-key \
        --requests "${BENCH_REQUESTS:-96}" --rate "${BENCH_RATE:-8}" --prompt-tokens 512 --max-tokens 128 --seed 0 \
        --out "$d/$name/bench$p.json" > /dev/null 2>&1
      log "(ab) round $p $name: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['output_tokens_per_s'], d['latency_p50_s'], d['latency_p99_s'], d['completed'])" "$d/$name/bench$p.json" 2>&1)"
    done
  done
  for name in "${ready[@]}"; do  # each traced worker writes its window (and memtrace's cost while serving)
    [ -d "$d/$name/run" ] || continue
    timeout 90 python3 -m memtrace window "$d/$name/run" --timeout 60 2>&1 | tee -a "$OUT/progress.log"
  done
  for c in "${CFG[@]}"; do stop_session "${SIDS[${c%%:*}]}" 20; done
  python3 - "$d" "${AB:-off:off:0;py-held:python:0;none-held:none:0;py-drain:python:5}" > "$OUT/serving-ab.json" <<'PY'
import glob, json, os, statistics, sys
d, cfg = sys.argv[1], [c.split(":") for c in sys.argv[2].split(";")]
out = {"configs": [], "rounds": {}}
for name, stacks, drain in cfg:
    rows = [json.load(open(f)) for f in sorted(glob.glob(f"{d}/{name}/bench*.json"))]
    out["rounds"][name] = rows
    tps = [r["output_tokens_per_s"] for r in rows if r.get("output_tokens_per_s")]
    out["configs"].append({"name": name, "stacks": stacks, "drain_s": drain, "rounds": len(rows),
                           "output_tokens_per_s": tps, "median": statistics.median(tps) if tps else None,
                           "p50_s": [r["latency_p50_s"] for r in rows], "p99_s": [r["latency_p99_s"] for r in rows]})
print(json.dumps(out, indent=1))
PY
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(c['name'], c['median'], c['output_tokens_per_s']) for c in d['configs']]" "$OUT/serving-ab.json" | tee -a "$OUT/progress.log"
  for c in "${CFG[@]}"; do  # the traces compressed, one tarball per configuration (logs, benches, trace)
    name=${c%%:*}
    for f in "$d/$name"/run/*.memtrace; do [ -f "$f" ] && xz -T0 -6 "$f"; done
    tar czf "$OUT/ab-$name.tar.gz" -C "$d" "$name"
  done
  rm -rf "$d"
fi

# ---- issue 29: the files users already have, recorded here ------------------------------------------------
if want annotations; then  # torch 2.14's user annotations and pinned host history (the stage's torch)
  mkdir -p "$W/annotations"
  timeout 120 python3 tests/gpu/record_annotations.py "$W/annotations" > "$W/annotations/out.txt" 2>&1; log "(annotations) exit $?"
  tee -a "$OUT/progress.log" < "$W/annotations/out.txt" | tail -8
  pack
fi
if want profiler && [ "$(left)" -gt 200 ]; then  # vLLM's own torch profiler, memory on, around one completion
  d=$W/profiler; rm -rf "$d"; mkdir -p "$d/profiles"; next_port
  PCFG="{\"profiler\": \"torch\", \"torch_profiler_dir\": \"$d/profiles\", \"torch_profiler_with_memory\": true}"
  start "$d/vllm.log" python3 -m vllm.entrypoints.openai.api_server --model /tmp/model-moe --port "$NEXT_PORT" "${COMMON[@]}" \
    --enforce-eager --profiler-config "$PCFG"
  P=$SID
  if wait_log "$d/vllm.log" "Application startup complete" "$P" $(( $(left) - 60 )); then
    post() { python3 -c "import sys, urllib.request as u; r = u.Request(sys.argv[1], data=b'', method='POST', headers={'Authorization': 'Bearer memtrace-secret-key'}); print(u.urlopen(r, timeout=300).status)" "http://127.0.0.1:$NEXT_PORT$1" 2>&1 | tail -1; }
    log "(profiler) start_profile: $(post /start_profile)"
    python3 "$HERE/serving_client.py" bench --port "$NEXT_PORT" --api-key memtrace-secret-key --requests 1 --rate 1 \
      --prompt-tokens 64 --max-tokens 2 --out "$d/completion.json" > /dev/null 2>&1
    log "(profiler) completion: $(tr -d '\n ' < "$d/completion.json" | cut -c1-200)"
    log "(profiler) stop_profile: $(post /stop_profile)"
    for _ in $(seq 60); do ls "$d"/profiles/*rank0*.pt.trace.json.gz > /dev/null 2>&1 && break; sleep 1; done; sleep 5
  else
    log "(profiler) the server did not start"; tail -20 "$d/vllm.log" | tee -a "$OUT/progress.log"
  fi
  stop_session "$P" 20
  ls -la "$d/profiles" | tee -a "$OUT/progress.log"
  timeout 120 python3 -m memtrace report "$d/profiles" > "$d/report.txt" 2>&1; log "(profiler) report exit $?"
  head -40 "$d/report.txt" | tee -a "$OUT/progress.log"
  pack
fi

# ---- serving (issue 30): a real serving OOM, and what serving mode costs ----------------------------------
serve_start() {  # serve_start DIR on|off [FLAGS...] -> SID; waits for "Application startup complete"
  local d=$1 mode=$2; shift 2; next_port
  if [ "$mode" = on ]; then
    start "$d/vllm.log" env PYTHONFAULTHANDLER=1 MEMTRACE_STACKS="${SERVE_STACKS:-python}" python3 -m memtrace run --dir "$d/run" --until serving -- \
      python3 -m vllm.entrypoints.openai.api_server --model /tmp/model-moe --port "$NEXT_PORT" "${COMMON[@]}" "$@"
  else
    start "$d/vllm.log" python3 -m vllm.entrypoints.openai.api_server --model /tmp/model-moe --port "$NEXT_PORT" "${COMMON[@]}" "$@"
  fi
  SERVE_SID=$SID
  wait_log "$d/vllm.log" "Application startup complete" "$SERVE_SID" $(( $(left) - 30 ))
}
if want serving && [ "$(left)" -gt 200 ]; then
  d=$W/serving; rm -rf "$d"; mkdir -p "$d"
  write_holder
  start "$d/holder.log" python3 "$W/leave.py" "${SMALL_FREE:-25769803776}"; H=$SID
  if wait_log "$d/holder.log" "holder pid" "$H" 60; then
    tee -a "$OUT/progress.log" < "$d/holder.log"
    start /dev/null nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader,nounits -lms 100 -f "$d/nvidia-smi.csv"; smi=$SID
    if serve_start "$d" on ${SERVE_FLAGS:-}; then
      if [ -n "${NEIGHBOUR_LEAVE:-}" ]; then  # another process starts on the GPU after vLLM (vLLM's own warning names it)
        start "$d/neighbour.log" python3 "$W/leave.py" "$NEIGHBOUR_LEAVE"; NB=$SID
        wait_log "$d/neighbour.log" "holder pid" "$NB" 60 && { log "(serving) neighbour after start-up:"; tee -a "$OUT/progress.log" < "$d/neighbour.log"; }
      fi
      log "(serving) ready; burst ($(left)s left)"
      timeout $(( $(left) - 40 )) python3 "$HERE/serving_client.py" burst --port "$NEXT_PORT" --api-key memtrace-secret-key \
        --concurrency "${BURST_CONCURRENCY:-64}" --prompt-tokens "${BURST_PROMPT:-16384}" --max-tokens "${BURST_MAX_TOKENS:-512}" \
        --max-s "${SERVE_BURST_S:-120}" ${BURST_ARGS:-} --out "$d/burst.json" > /dev/null 2>&1
      log "(serving) burst: $(tr -d '\n' < "$d/burst.json" 2>/dev/null | cut -c1-300)"
      timeout 90 python3 -m memtrace window "$d/run" --timeout 60 2>&1 | tee -a "$OUT/progress.log"  # if it still lives
    else
      log "(serving) the server did not start"
    fi
    stop_session "$SERVE_SID" 20; stop_session "$smi" 2; [ -n "${NB:-}" ] && stop_session "$NB" 5
    grep -E "memtrace|OutOfMemory|CUDA out of memory|Error" "$d/vllm.log" | cut -c1-400 | head -40 | tee -a "$OUT/progress.log"
    timeout 90 python3 -m memtrace report "$d/run" > "$d/report.txt" 2>&1; log "(serving) report exit $?"
    sed -n '/Serving window/,/Warnings/p' "$d/report.txt" | tee -a "$OUT/progress.log"
    for f in "$d"/run/*.memtrace; do [ -f "$f" ] && xz -k -T0 "$f"; done
  else
    log "(serving) the holder did not start"
  fi
  stop_session "$H" 5
  pack
fi
if want serving-cost; then
  d=$W/serving-cost; mkdir -p "$d"
  for ((p = FIRST_ROUND; p < FIRST_ROUND + ROUNDS; p++)); do  # as cost: a later call goes on (rounds kept in $W)
    if ((p % 2)); then order=(on off); else order=(off on); fi
    for mode in "${order[@]}"; do
      [ "$(left)" -lt 150 ] && { log "(serving-cost) out of time before round $p $mode"; break 2; }
      r=$d/round$p-$mode; mkdir -p "$r"
      if serve_start "$r" "$mode" ${SERVE_FLAGS:-}; then
        python3 "$HERE/serving_client.py" bench --port "$NEXT_PORT" --api-key memtrace-secret-key --requests "${BENCH_REQUESTS:-200}" \
          --rate "${BENCH_RATE:-8}" --prompt-tokens 512 --max-tokens 128 --seed 0 --out "$r/bench.json" > /dev/null 2>&1
        log "(serving-cost) round $p $mode: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['output_tokens_per_s'], d['latency_p50_s'], d['latency_p99_s'], d['completed'])" "$r/bench.json" 2>&1)"
      fi
      stop_session "$SERVE_SID" 20
    done
  done
  python3 - "$d" > "$OUT/serving-cost.json" <<'PY'
import glob, json, os, statistics, sys
rows = [{"round": os.path.basename(os.path.dirname(f)), **json.load(open(f))} for f in sorted(glob.glob(sys.argv[1] + "/round*/bench.json"))]
def agg(mode, key):
    xs = [r[key] for r in rows if r["round"].endswith("-" + mode) and r.get(key) is not None]
    return {"values": xs, "median": statistics.median(xs) if xs else None, "spread": (max(xs) - min(xs)) if xs else None}
keys = ("output_tokens_per_s", "latency_p50_s", "latency_p99_s")
print(json.dumps({"rounds": rows, "on": {k: agg("on", k) for k in keys}, "off": {k: agg("off", k) for k in keys}}, indent=1))
PY
  cat "$OUT/serving-cost.json" | python3 -c "import json,sys; d=json.load(sys.stdin); print({m: {k: v['median'] for k, v in d[m].items()} for m in ('on','off')})" | tee -a "$OUT/progress.log"
  pack
fi
