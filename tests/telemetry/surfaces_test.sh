#!/usr/bin/env bash
# One schema for a step's numbers (jobs.v1.StepMetrics): one real run (emberd, the real
# ember-worker, 2 CPU ranks, FSDP with clipping and checkpoints) whose numbers are equal on all
# four surfaces: the ranks' metrics files (the reference), emberd's /metrics, the job page's series
# API and `emberctl plot --json`; and every numeric StepMetrics field (read from proto/jobs.proto's
# text) is on each of them by name. The workers are stopped (SIGSTOP) while the surfaces are read,
# so all four see the same lines; check_surfaces.py compares. Loopback only; every wait bounded;
# every process started here is killed on exit.
set -u  # no pipefail: `cmd | grep -q` closes the pipe early
EMBERD="$1"; EMBERCTL="$2"; WORKER="$3"; CORPUS="$4"; CHECK="$5"; PROTO="$6"
T="${TEST_TMPDIR:-$(mktemp -d)}/surfaces"
rm -rf "$T"; mkdir -p "$T/s"
fail() { echo "FAIL: $*" >&2; [ -f "$T/emberd.log" ] && tail -20 "$T/emberd.log" >&2; exit 1; }
PIDS=()
JOB=""
job_pids() { grep -lxzF "EMBER_JOB_ID=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3; }
cleanup() {
  if [ -n "$JOB" ]; then
    for p in $(job_pids "$JOB"); do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  fi
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  true
}
trap cleanup EXIT
command -v curl >/dev/null || { echo "SKIPPED: curl is not installed"; exit 0; }
PY=/usr/bin/python3

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$T/token"
TOKEN=$(cat "$T/token")
source tests/e2e/emberd_lib.sh
start_emberd "$T/emberd.log" "$EMBERD" --listen=127.0.0.1:0 --store-listen=127.0.0.1:0 \
  --http-listen=127.0.0.1:0 --metrics-auth=token --host-store --node-name=surf \
  --auth-token-file="$T/token" --work-root="$T/jobs" --worker-binary="$WORKER" --cpu-slots=2 \
  --cuda-devices=0 || fail "emberd did not start"
PIDS+=($DPID)
[ -n "$HTTP" ] || fail "emberd did not report its http address"
export EMBER_ADDRESS="$API" EMBER_TOKEN_FILE="$T/token"

cp "$CORPUS" "$T/tiny_corpus.txt"
printf 'name: surfaces\nmodel: {vocab_size: 256, context_length: 32, n_layers: 1, n_heads: 2, d_model: 32}\ndata: {text_path: tiny_corpus.txt}\noptimizer: {lr: 0.003, grad_clip: 1.0}\nparallelism: {strategy: fsdp, world_size: 2}\nresources: {device_type: cpu}\nsteps: 1000000\nbatch_size: 4\nthreads: 1\nlog_every: 1\ncheckpoint: {every_steps: 3}\n' \
  > "$T/job.yaml"
JOB=$("$EMBERCTL" submit "$T/job.yaml") || fail "submit"
JOB=${JOB%% *}
JD="$T/jobs/$JOB"
lines() { cat "$JD/metrics/rank-$1.jsonl" 2>/dev/null | wc -l; }
for _ in $(seq 600); do
  [ "$(lines 0)" -ge 8 ] && [ "$(lines 1)" -ge 8 ] && break
  sleep 0.1
done
[ "$(lines 0)" -ge 8 ] && [ "$(lines 1)" -ge 8 ] || fail "the job did not log 8 steps on both ranks"
PAUSED=$(job_pids "$JOB")
[ -n "$PAUSED" ] || fail "no worker processes for $JOB"
for p in $PAUSED; do kill -STOP "$p"; done
sleep 0.5  # a line being written when stopped stays partial: every reader skips it

curl -s --fail --max-time 10 -H "Authorization: Bearer $TOKEN" "http://$HTTP/metrics" \
  > "$T/s/metrics.txt" || fail "/metrics"
FIELDS=$("$PY" -c '
import re, sys
body = re.search(r"^message StepMetrics \{(.*?)^\}", open(sys.argv[1]).read(), re.S | re.M).group(1)
body = re.sub(r"//[^\n]*", "", body)
print(" ".join(n for l, t, n in re.findall(r"(optional\s+|repeated\s+)?([\w.]+)\s+(\w+)\s*=\s*\d+", body)
               if not l.startswith("repeated") and t in ("int32", "int64", "double", "float", "uint32", "uint64")))' "$PROTO")
[ -n "$FIELDS" ] || fail "no StepMetrics fields in $PROTO"
for f in $FIELDS; do
  "$EMBERCTL" plot "$JOB" --metric "$f" --json --max-points 2048 > "$T/s/plot-$f.json" ||
    fail "emberctl plot --metric $f --json"
  curl -s --fail --max-time 10 -H "Authorization: Bearer $TOKEN" \
    "http://$HTTP/api/jobs/$JOB/series?metric=$f&max_points=2048" > "$T/s/page-$f.json" ||
    fail "the job page's series of $f"
done
mkdir -p "$T/s/job" && cp -r "$JD/metrics" "$T/s/job/"  # the reference, as the surfaces saw it
"$PY" "$CHECK" "$PROTO" "$T/s/job" 2 "$T/s" || {
  [ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ] && cp -r "$T/s" "$TEST_UNDECLARED_OUTPUTS_DIR/"
  fail "the surfaces disagree (above)"
}
for p in $PAUSED; do kill -CONT "$p"; done
"$EMBERCTL" cancel "$JOB" > /dev/null || fail "cancel"
for _ in $(seq 100); do [ -z "$(job_pids "$JOB")" ] && break; sleep 0.1; done
[ -z "$(job_pids "$JOB")" ] || fail "workers still running 10 s after cancel: $(job_pids "$JOB")"
echo "PASS"
