#!/usr/bin/env bash
# `emberctl run --standalone` as a user runs it, with the real ember-worker:
#   * a world size the machine cannot run (65536 ranks) is refused before any worker is forked,
#     naming --max-ranks (it used to fork workers until killed);
#   * SIGTERM, SIGHUP and kill -9 of emberctl leave no worker behind within 10 s (workers used to
#     run on for ~5.5 minutes): signals cancel like Ctrl-C, and PR_SET_PDEATHSIG kills the workers
#     of a launcher that could not clean up.
# Loopback only; every wait bounded; every process this test started is killed on exit.
set -uo pipefail
EMBERCTL="$1"; WORKER="$2"; CORPUS="$3"
T="${TEST_TMPDIR:-$(mktemp -d)}/standalone"
mkdir -p "$T"
fail() { echo "FAIL: $*" >&2; exit 1; }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done; true; }
trap cleanup EXIT

# pids of live processes whose environment has EMBER_JOB_ID=$1 (environ is NUL-separated)
job_pids() {
  grep -lxzF "EMBER_JOB_ID=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
}

cp "$CORPUS" "$T/tiny_corpus.txt"
spec() {  # name world
  printf 'name: %s\nmodel: {vocab_size: 256, context_length: 32, n_layers: 1, n_heads: 2, d_model: 32}\ndata: {text_path: tiny_corpus.txt}\nparallelism: {strategy: fsdp, world_size: %s}\nresources: {device_type: cpu}\nsteps: 1000000\nbatch_size: 4\nthreads: 1\nlog_every: 1\n' "$1" "$2"
}

# 1. Too many ranks: refused at once, nothing forked.
spec sa-huge 65536 > "$T/huge.yaml"
out=$(timeout 30 "$EMBERCTL" run --standalone --worker "$WORKER" --work-root "$T/huge" "$T/huge.yaml" 2>&1); rc=$?
[ $rc -eq 2 ] || fail "65536 ranks: rc=$rc (want 2): $out"
echo "$out" | grep -q "65536 CPU ranks" || fail "message names the ranks: $out"
echo "$out" | grep -q -- "--max-ranks" || fail "message names --max-ranks: $out"
[ -z "$(ls "$T/huge" 2>/dev/null | grep -v '^\.emberd$')" ] || fail "a job directory was made: $(ls -a "$T/huge")"
# --max-ranks lowers the limit too (2 ranks refused at --max-ranks 1).
spec sa-two 2 > "$T/two.yaml"
out=$(timeout 30 "$EMBERCTL" run --standalone --max-ranks 1 --worker "$WORKER" --work-root "$T/two" "$T/two.yaml" 2>&1); rc=$?
[ $rc -eq 2 ] || fail "--max-ranks 1: rc=$rc: $out"
echo "$out" | grep -q "at most 1 from --max-ranks" || fail "--max-ranks message: $out"

# 2. Every signal: the workers die with emberctl.
for sig in TERM HUP KILL; do
  spec "sa-$sig" 2 > "$T/$sig.yaml"
  "$EMBERCTL" run --standalone --worker "$WORKER" --work-root "$T/w-$sig" "$T/$sig.yaml" \
    > "$T/$sig.out" 2> "$T/$sig.err" &
  CPID=$!
  PIDS+=("$CPID")
  JOB=""
  for _ in $(seq 300); do
    JOB=$(grep -o "running [^ ]*" "$T/$sig.err" | head -1 | cut -d' ' -f2)
    [ -n "$JOB" ] && [ "$(job_pids "$JOB" | wc -l)" -eq 2 ] && break
    sleep 0.1
  done
  [ -n "$JOB" ] || { cat "$T/$sig.err"; fail "SIG$sig: the job did not start"; }
  [ "$(job_pids "$JOB" | wc -l)" -eq 2 ] || fail "SIG$sig: 2 workers expected: $(job_pids "$JOB")"
  # Training for real before the signal (the worker logs its steps).
  for _ in $(seq 300); do
    grep -q "step" "$T/w-$sig/$JOB/logs/rank-0.log" 2>/dev/null && break
    sleep 0.1
  done
  t0=$(date +%s%N)
  kill -"$sig" "$CPID"
  gone=""
  end=$((SECONDS + 10))
  while [ $SECONDS -lt $end ]; do
    if [ -z "$(job_pids "$JOB")" ]; then gone=$(( ($(date +%s%N) - t0) / 1000000 )); break; fi
    sleep 0.1
  done
  [ -n "$gone" ] || fail "SIG$sig: workers still running 10 s after emberctl got the signal: $(job_pids "$JOB")"
  for _ in $(seq 100); do kill -0 "$CPID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$CPID" 2>/dev/null && fail "SIG$sig: emberctl still running"
  wait "$CPID"; rc=$?
  if [ "$sig" != KILL ]; then
    [ $rc -eq 6 ] || { cat "$T/$sig.err"; fail "SIG$sig: emberctl exit $rc (want 6, cancelled)"; }
  fi
  echo "SIG$sig: no worker left ${gone} ms after the signal"
done
echo PASS
