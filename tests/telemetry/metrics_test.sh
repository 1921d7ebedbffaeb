#!/usr/bin/env bash
# emberd's /metrics with a real job (the real ember-worker, 2 ranks, CPU), as operators use it:
#   * metrics_auth token: no token or a wrong one gets 401; the cluster token gets 200; a daemon
#     with metrics_auth none answers without one;
#   * `promtool check metrics` (Debian's prometheus package) accepts the output;
#   * a real Prometheus, started here on loopback (scrape_interval 1s, storage in a temp dir,
#     bearer token from a file), scrapes it and its query API returns the job's loss series, with
#     a value that rank 0 wrote to its metrics file;
#   * every ember_* series the Grafana dashboard (deploy/grafana) plots is exported.
# Missing promtool/prometheus/curl: those parts print SKIPPED. Loopback only; every wait bounded;
# every process started here is killed on exit.
set -u  # no pipefail: `cmd | grep -q` closes the pipe early
EMBERD="$1"; EMBERCTL="$2"; WORKER="$3"; CORPUS="$4"; DASHBOARD="$5"
T="${TEST_TMPDIR:-$(mktemp -d)}/telemetry"
rm -rf "$T"; mkdir -p "$T"
fail() { echo "FAIL: $*" >&2; exit 1; }
PIDS=()
JOB=""
# The job's workers (own sessions, outliving a killed emberd): live processes with EMBER_JOB_ID=$1.
job_pids() { grep -lxzF "EMBER_JOB_ID=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3; }
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  [ -n "$JOB" ] && for p in $(job_pids "$JOB"); do kill -KILL "$p" 2>/dev/null; done
  true
}
trap cleanup EXIT
command -v curl >/dev/null || { echo "SKIPPED: curl is not installed"; exit 0; }
PY=/usr/bin/python3

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$T/token"
TOKEN=$(cat "$T/token")
source tests/e2e/emberd_lib.sh
start_emberd "$T/emberd.log" "$EMBERD" --listen=127.0.0.1:0 --store-listen=127.0.0.1:0 \
  --http-listen=127.0.0.1:0 --metrics-auth=token --host-store --node-name=tele \
  --auth-token-file="$T/token" --work-root="$T/jobs" --worker-binary="$WORKER" --cpu-slots=2 \
  --cuda-devices=0
PIDS+=($DPID)
HTTP_MAIN="$HTTP"
[ -n "$HTTP" ] || fail "emberd did not report its http address"
export EMBER_ADDRESS="$API" EMBER_TOKEN_FILE="$T/token"

# 1. Token mode.
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "http://$HTTP/metrics")
[ "$code" = 401 ] || fail "/metrics without a token: HTTP $code (want 401)"
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -H "Authorization: Bearer nope" \
  "http://$HTTP/metrics")
[ "$code" = 401 ] || fail "/metrics with a wrong token: HTTP $code (want 401)"
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "http://$HTTP/nothing")
[ "$code" = 404 ] || fail "unknown path: HTTP $code (want 404)"
# metrics_auth: none leaves /metrics open (the API keeps its token).
start_emberd "$T/emberd-open.log" "$EMBERD" --listen=127.0.0.1:0 --store-listen=127.0.0.1:0 \
  --http-listen=127.0.0.1:0 --metrics-auth=none --host-store --node-name=open \
  --auth-token-file="$T/token" --work-root="$T/jobs-open" --worker-binary="$WORKER" --cpu-slots=1 \
  --cuda-devices=0
OPEN_PID=$DPID
PIDS+=($OPEN_PID)
OPEN="$HTTP"; HTTP="$HTTP_MAIN"
[ -n "$OPEN" ] || fail "the second emberd did not report its http address"
curl -s --fail --max-time 10 "http://$OPEN/metrics" | grep -q '^ember_node_cpu_slots 1$' ||
  fail "metrics_auth none: /metrics without a token did not answer"
kill -TERM "$OPEN_PID"

scrape() { curl -s --fail --max-time 10 -H "Authorization: Bearer $TOKEN" "http://$HTTP/metrics"; }

# 2. A real job; wait until rank 0's loss shows.
cp "$CORPUS" "$T/tiny_corpus.txt"
printf 'name: tele\nmodel: {vocab_size: 256, context_length: 32, n_layers: 1, n_heads: 2, d_model: 32}\ndata: {text_path: tiny_corpus.txt}\nparallelism: {strategy: fsdp, world_size: 2}\nresources: {device_type: cpu}\nsteps: 1000000\nbatch_size: 4\nthreads: 1\nlog_every: 5\ncheckpoint: {every_steps: 50}\n' \
  > "$T/job.yaml"
JOB=$("$EMBERCTL" submit "$T/job.yaml") || fail "submit"
JOB=${JOB%% *}
for _ in $(seq 300); do
  scrape > "$T/metrics.txt" 2>/dev/null
  grep -q "^ember_job_loss{job_id=\"$JOB\"}" "$T/metrics.txt" &&
    grep -q "^ember_rank_step{job_id=\"$JOB\",rank=\"1\"}" "$T/metrics.txt" && break
  sleep 0.2
done
grep -q "^ember_job_loss{job_id=\"$JOB\"}" "$T/metrics.txt" ||
  { cat "$T/metrics.txt"; tail -20 "$T/emberd.log"; fail "no ember_job_loss for $JOB"; }
for m in "ember_jobs{state=\"running\"} 1" "ember_daemon_workers 2" \
         "ember_job_state{job_id=\"$JOB\",state=\"running\"} 1" "ember_node_cpu_slots 2"; do
  grep -qF "$m" "$T/metrics.txt" || fail "missing '$m' in: $(cat "$T/metrics.txt")"
done
grep -q '^ember_rank_collective_bytes{job_id="'"$JOB"'",rank="0",collective="all_gather",dtype="f32"} [1-9]' \
  "$T/metrics.txt" || fail "no all_gather bytes for rank 0"
grep -q '^ember_store_op_duration_seconds_count{op="heartbeat"} [1-9]' "$T/metrics.txt" ||
  fail "no heartbeat latency"
# Every loss we exported is one rank 0 wrote (the metrics file is the reference).
loss_in_file() {  # value -> exit 0 when rank 0's metrics file has that loss (to 1e-6 relative)
  "$PY" - "$1" "$T/jobs/$JOB/metrics/rank-0.jsonl" <<'PYEOF'
import json, sys
v = float(sys.argv[1])
for line in open(sys.argv[2]):
    try: l = json.loads(line)["loss"]
    except Exception: continue
    if l is not None and abs(l - v) <= 1e-6 * max(1.0, abs(v)): sys.exit(0)
sys.exit(1)
PYEOF
}
LOSS=$(grep "^ember_job_loss{job_id=\"$JOB\"}" "$T/metrics.txt" | awk '{print $2}')
loss_in_file "$LOSS" || fail "exported loss $LOSS is not in rank 0's metrics file"

# 3. promtool.
if command -v promtool >/dev/null; then
  scrape > "$T/check.txt"
  promtool check metrics < "$T/check.txt" > "$T/promtool.out" 2>&1 ||
    { cat "$T/promtool.out"; fail "promtool check metrics rejected /metrics"; }
  echo "promtool check metrics: OK ($(grep -vc '^#' "$T/check.txt") samples)"
else
  echo "SKIPPED: promtool is not installed (Debian package prometheus)"
fi

# 4. The dashboard plots only what exists (DCGM_* need NVML: not checked here).
"$PY" -m json.tool "$DASHBOARD" > /dev/null || fail "the dashboard is not valid JSON"
missing="x"
for _ in $(seq 120); do  # ember_rank_checkpoint_save_seconds needs the first checkpoint (step 50)
  scrape > "$T/check2.txt"
  missing=""
  for name in $(grep -o 'ember_[a-z_]*' "$DASHBOARD" | sed 's/_bucket$//' | sort -u); do
    grep -q "^# TYPE $name " "$T/check2.txt" || missing="$missing $name"
  done
  [ -z "$missing" ] && break
  sleep 0.5
done
[ -z "$missing" ] || fail "the dashboard plots$missing, which /metrics lacks"

# 5. A real Prometheus.
if ! command -v prometheus >/dev/null; then
  echo "SKIPPED: prometheus is not installed (Debian package prometheus)"
else
  cat > "$T/prometheus.yml" <<YML
global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: ember
    authorization: {type: Bearer, credentials_file: $T/token}
    static_configs: [{targets: ['$HTTP']}]
YML
  PROM=""
  for try in 1 2 3; do
    PPORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    prometheus --config.file="$T/prometheus.yml" --storage.tsdb.path="$T/prom-$try" \
      --web.listen-address="127.0.0.1:$PPORT" > "$T/prometheus-$try.log" 2>&1 &
    PPID_=$!
    PIDS+=($PPID_)
    for _ in $(seq 150); do
      curl -s --max-time 2 "http://127.0.0.1:$PPORT/-/ready" 2>/dev/null | grep -qi ready && { PROM=$PPORT; break; }
      kill -0 "$PPID_" 2>/dev/null || break
      sleep 0.2
    done
    [ -n "$PROM" ] && break
    kill -KILL "$PPID_" 2>/dev/null
  done
  [ -n "$PROM" ] || { tail -20 "$T"/prometheus-*.log; fail "prometheus did not start"; }
  ok=""
  for _ in $(seq 60); do
    curl -s --max-time 5 "http://127.0.0.1:$PROM/api/v1/query" \
      --data-urlencode "query=ember_job_loss{job_id=\"$JOB\"}" > "$T/query.json"
    VAL=$("$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
res = r.get("data", {}).get("result", [])
if r.get("status") == "success" and res:
    m = res[0]["metric"]
    assert m["job"] == "ember" and m["job_id"] == sys.argv[2], m
    print(res[0]["value"][1])' "$T/query.json" "$JOB" 2>/dev/null)
    [ -n "$VAL" ] && { ok=1; break; }
    sleep 0.5
  done
  [ -n "$ok" ] || { cat "$T/query.json"; tail -20 "$T"/prometheus-*.log; fail "Prometheus has no ember_job_loss for $JOB"; }
  loss_in_file "$VAL" || fail "Prometheus' loss $VAL is not in rank 0's metrics file"
  curl -s --max-time 5 "http://127.0.0.1:$PROM/api/v1/query" \
    --data-urlencode 'query=up{job="ember"}' | grep -q '"value":\[[0-9.]*,"1"\]' ||
    fail "the ember target is not up in Prometheus"
  echo "prometheus: ember_job_loss{job_id=\"$JOB\"} = $VAL"
fi

"$EMBERCTL" cancel "$JOB" > /dev/null || fail "cancel"
for _ in $(seq 100); do [ -z "$(job_pids "$JOB")" ] && break; sleep 0.1; done
[ -z "$(job_pids "$JOB")" ] || fail "workers still running 10 s after cancel: $(job_pids "$JOB")"
echo "PASS"
