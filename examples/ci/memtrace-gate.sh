#!/usr/bin/env bash
# A CI memory gate for a vLLM start-up, in plain shell (any CI runner with a GPU):
#   0. `memtrace doctor`: the installed vLLM, FlashInfer and torch still have every path memtrace hooks
#      (exit 1 before spending a GPU start-up on a trace that would miss phases);
#   1. record the start-up with memtrace (`memtrace run -- vllm serve ...`), stop vLLM once it serves;
#   2. check it against the history of accepted runs of the same environment (GPU, driver, CUDA,
#      torch, vLLM, FlashInfer, model, memory flags) and record it: accepted if nothing grew past
#      the threshold, refused otherwise;
#   3. keep the timeline, the flame graph at the peak, the report and the history's trend as artifacts.
# Exit status: memtrace history check's (0 pass, 1 grew past the threshold, died of OOM or had no accepted
# run of its environment to be compared with, 2 bad input).
#
# Settings (environment variables):
#   MODEL        the model to serve (default Qwen/Qwen3-30B-A3B)
#   VLLM_ARGS    extra `vllm serve` flags (default: the seed's --max-num-batched-tokens 8192 --max-num-seqs 8)
#   HISTORY      the history database, kept between jobs (default memtrace-history.sqlite)
#   FAIL_OVER    allowed growth: 2% or 512MiB (default 2%)
#   ALLOW_NEW    1: a run of an environment the history has no accepted run of passes (nothing compared) and
#                becomes its reference; set it for the first run of a new GPU, driver, vLLM, model... (default 0:
#                such a run fails, as a gate never passes what it did not compare)
#   ARTIFACTS    where the artifacts go (default memtrace-artifacts)
#   PORT         vLLM's port (default 8000); START_TIMEOUT seconds to wait for it (default 1800)
#   RUN          an already recorded run: skip step 1 and gate this one (how the tests drive this script)
set -uo pipefail

MODEL=${MODEL:-Qwen/Qwen3-30B-A3B}
VLLM_ARGS=${VLLM_ARGS:---max-num-batched-tokens 8192 --max-num-seqs 8 --gpu-memory-utilization 0.92}
HISTORY=${HISTORY:-memtrace-history.sqlite}
FAIL_OVER=${FAIL_OVER:-2%}
ALLOW_NEW=${ALLOW_NEW:-0}
ARTIFACTS=${ARTIFACTS:-memtrace-artifacts}
PORT=${PORT:-8000}
START_TIMEOUT=${START_TIMEOUT:-1800}

mkdir -p "$ARTIFACTS" || exit 2

if ! memtrace doctor >"$ARTIFACTS/doctor.txt"; then
  cat "$ARTIFACTS/doctor.txt" >&2
  echo "memtrace doctor: this vLLM/FlashInfer moved paths memtrace hooks; no gate on a trace that misses them" >&2
  exit 1
fi

record() {
  # memtrace run stops recording when start-up completes; vLLM then serves until we stop it
  local run="$ARTIFACTS/run"
  # shellcheck disable=SC2086  # VLLM_ARGS is a list of flags
  memtrace run --dir "$run" -- vllm serve "$MODEL" --port "$PORT" $VLLM_ARGS >"$ARTIFACTS/vllm.log" 2>&1 &
  local pid=$! waited=0
  until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "vLLM exited before serving (see $ARTIFACTS/vllm.log); gating what was recorded" >&2
      break
    fi
    if [ "$waited" -ge "$START_TIMEOUT" ]; then
      echo "vLLM did not serve within ${START_TIMEOUT}s; stopping it" >&2
      break
    fi
    sleep 5
    waited=$((waited + 5))
  done
  kill -TERM "$pid" 2>/dev/null  # memtrace run forwards it to vLLM
  wait "$pid"
  RUN=$run
}

if [ -z "${RUN:-}" ]; then
  record
fi

# the report, the timeline and the flame graph at the peak (a run that died shows its OOM)
memtrace report "$RUN" >"$ARTIFACTS/report.txt"
memtrace report "$RUN" --markdown >"$ARTIFACTS/report.md"
memtrace plot "$RUN" -o "$ARTIFACTS/timeline.png" --force
memtrace flame "$RUN" -o "$ARTIFACTS/flame.svg" --force

# the gate: against the last accepted run of the same environment, then recorded in the history
new=()
if [ "$ALLOW_NEW" = 1 ]; then new=(--allow-new); fi
memtrace history check "$RUN" --db "$HISTORY" --fail-over "$FAIL_OVER" --add "${new[@]}" 2>&1 | tee "$ARTIFACTS/history-check.txt"
status=${PIPESTATUS[0]}
memtrace history show --db "$HISTORY" -o "$ARTIFACTS/history-trend.png" --force >"$ARTIFACTS/history.txt"
exit "$status"
