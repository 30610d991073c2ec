# Shell helpers shared by the device scripts (tests/gpu/vllm_round2.sh, tests/gpu/vllm034/startups.sh):
# logging to $OUT/progress.log, processes started in their own session (setsid) and stopped as a group,
# waits on log lines with a deadline. The caller sets OUT, LIMIT (seconds for the whole script), STEPS
# (comma-separated) and W (work folder; the session ids of everything started go to $W/sids).
log() { printf '[%s +%3ds] %s\n' "$(date -u +%H:%M:%S)" "$SECONDS" "$*" | tee -a "$OUT/progress.log"; }
left() { echo $((LIMIT - SECONDS)); }
want() { [[ ",$STEPS," == *",$1,"* ]]; }
session_pids() { ps -eo pid=,sid= | awk -v s="$1" '$2 == s {print $1}'; }

# Stop everything in session SID: SIGTERM to its leader (`memtrace run` forwards it to vLLM's API server,
# which shuts its engine down), then SIGTERM to every process of the session, then SIGKILL. (Not SIGINT:
# a background command of a script starts with SIGINT ignored, and Python keeps it ignored.)
stop_session() {
  local sid=$1 grace=${2:-20} i
  [ -n "$(session_pids "$sid")" ] || return 0
  kill -TERM "$sid" 2>/dev/null
  for ((i = 0; i < grace; i++)); do [ -n "$(session_pids "$sid")" ] || return 0; sleep 1; done
  session_pids "$sid" | xargs -r kill -TERM 2>/dev/null
  for ((i = 0; i < 10; i++)); do [ -n "$(session_pids "$sid")" ] || return 0; sleep 1; done
  log "session $sid still alive after SIGTERM: SIGKILL"
  session_pids "$sid" | xargs -r kill -KILL 2>/dev/null; sleep 1
}

# start LOGFILE CMD... : run CMD in a new session, output to LOGFILE; sets SID (the session id)
start() {
  local logfile=$1; shift
  setsid "$@" > "$logfile" 2>&1 < /dev/null &
  SID=$!
  echo "$SID" >> "$W/sids"
}

# wait_log FILE REGEX SID SECONDS: 0 = REGEX seen, 1 = the session ended first, 2 = timed out
wait_log() {
  local f=$1 re=$2 sid=$3 until=$((SECONDS + $4))
  [ "$until" -gt "$LIMIT" ] && until=$LIMIT
  while :; do
    grep -qE "$re" "$f" 2>/dev/null && return 0
    if [ -z "$(session_pids "$sid")" ]; then grep -qE "$re" "$f" 2>/dev/null && return 0; return 1; fi
    [ "$SECONDS" -ge "$until" ] && return 2
    sleep 1
  done
}

# wait_end SID SECONDS: 0 = the session ended, 2 = timed out
wait_end() {
  local until=$((SECONDS + $2))
  [ "$until" -gt "$LIMIT" ] && until=$LIMIT
  while [ -n "$(session_pids "$1")" ]; do [ "$SECONDS" -ge "$until" ] && return 2; sleep 1; done
  return 0
}

cleanup_all() {
  [ -f "$W/sids" ] || return 0
  local sid
  while read -r sid; do [ -n "$sid" ] && stop_session "$sid" 5; done < "$W/sids"
  : > "$W/sids"
}

