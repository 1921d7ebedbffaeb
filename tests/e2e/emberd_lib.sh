# Shared by the shell end-to-end tests: start one emberd in the background and wait for its
# "ready" line (the addresses it bound, port 0 = any free port).
#
#   source tests/e2e/emberd_lib.sh
#   start_emberd LOG EMBERD ARGS...   # sets DPID, API (host:port) and HTTP (host:port or "")
#
# Returns 1, after printing the log's tail, when emberd exits first or is not ready within 30 s.
# The caller owns DPID (kill it in its EXIT trap).
start_emberd() {
  local log="$1"; shift
  "$@" > "$log" 2>&1 &
  DPID=$!
  API=""; HTTP=""
  for _ in $(seq 300); do
    API=$(grep -o "ready: api 127.0.0.1:[0-9]*" "$log" | grep -o "127.0.0.1:[0-9]*")
    if [ -n "$API" ]; then
      HTTP=$(grep -o "ready: api .*, http 127.0.0.1:[0-9]*" "$log" | grep -o "http 127.0.0.1:[0-9]*" |
             grep -o "127.0.0.1:[0-9]*")
      return 0
    fi
    kill -0 "$DPID" 2>/dev/null || break
    sleep 0.1
  done
  echo "emberd did not become ready (log $log):" >&2
  tail -30 "$log" >&2
  return 1
}
