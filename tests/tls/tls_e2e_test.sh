#!/usr/bin/env bash
# TLS and mTLS end to end with the real binaries: a PKI made now with openssl (make_certs.sh), an
# ember-store serving TLS, an emberd joining it (its API on TLS too), emberctl submitting a tiny
# job that the real ember-worker trains (its store connection on TLS) -> SUCCEEDED; once with TLS
# only, once with client certificates required (mTLS). Also: ember-store refuses to start without
# a token; a plaintext store client (emberd) against the TLS store and a plaintext emberctl
# against the TLS emberd fail naming TLS; without (or with a foreign) client certificate the mTLS
# emberd refuses emberctl; a TLS emberctl against a plaintext server fails naming it. In the mTLS
# run the job spans two daemons (one CPU slot each), so emberctl logs of the remote rank goes daemon
# to daemon over mTLS; a last run uses the store hosted by emberd. Loopback only; every wait
# bounded; every process killed on exit.
set -uo pipefail
STORE="$1"; EMBERD="$2"; EMBERCTL="$3"; WORKER="$4"; CORPUS="$5"
T="${TEST_TMPDIR:-$(mktemp -d)}/tls"
rm -rf "$T"; mkdir -p "$T"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done; true; }
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$T"/*.log; do echo "--- $f"; tail -20 "$f"; done >&2
  exit 1
}

tests/tls/make_certs.sh "$T/pki" || fail "make_certs.sh"
P="$T/pki"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$T/token"
export EMBER_TOKEN_FILE="$T/token"

# ember-store without a token refuses to start (exit 2), like emberd.
"$STORE" --listen=127.0.0.1:0 > "$T/noauth.log" 2>&1; rc=$?
[ $rc -eq 2 ] || fail "ember-store without --auth-token-file: rc=$rc, want 2"
grep -q -- "--insecure-no-auth" "$T/noauth.log" || fail "the refusal names --insecure-no-auth"

# The tiny job: tiny-gpt's model on 2 CPU ranks, 4 steps, the tiny corpus uploaded by emberctl.
mkdir -p "$T/job/data"
cp "$CORPUS" "$T/job/data/tiny_corpus.txt"
cat > "$T/job/tiny.yaml" <<'YAML'
name: tls-tiny
model: {vocab_size: 256, context_length: 64, n_layers: 2, n_heads: 4, d_model: 64, mlp: swiglu}
data: {text_path: data/tiny_corpus.txt}
optimizer: {name: adamw, lr: 0.003, schedule: cosine, warmup_steps: 1, grad_clip: 1.0}
parallelism: {strategy: fsdp, world_size: 2}
resources: {device_type: cpu}
steps: 4
batch_size: 8
seed: 1
log_every: 1
YAML

STORE_ADDR=""
start_store() {  # NAME ARGS...: sets STORE_ADDR (the token comes first: --insecure-no-auth drops it)
  local name=$1; shift
  local auth=(--auth-token-file="$T/token")
  [ "${1:-}" = --insecure-no-auth ] && auth=()
  "$STORE" --listen=127.0.0.1:0 --port-file="$T/$name.port" "${auth[@]}" "$@" \
    > "$T/$name-store.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do [ -s "$T/$name.port" ] && break; sleep 0.1; done
  [ -s "$T/$name.port" ] || fail "$name: ember-store did not start"
  STORE_ADDR="127.0.0.1:$(cat "$T/$name.port")"
}

API=""; DPID=""; SLOTS=2
start_emberd() {  # NAME ARGS...: sets API and DPID; returns 1 if emberd exited instead
  local name=$1; shift
  local store=()
  [ -n "$STORE_ADDR" ] && store=(--store="$STORE_ADDR")
  "$EMBERD" --listen=127.0.0.1:0 "${store[@]}" --node-name="$name" \
    --auth-token-file="$T/token" --work-root="${WORK:-$T/$name-jobs}" --worker-binary="$WORKER" \
    --cpu-slots="$SLOTS" --cuda-devices=0 "$@" > "$T/$name-emberd.log" 2>&1 &
  DPID=$!
  PIDS+=($DPID)
  API=""
  for _ in $(seq 150); do
    API=$(grep -o "ready: api 127.0.0.1:[0-9]*" "$T/$name-emberd.log" | grep -o "127.0.0.1:[0-9]*")
    [ -n "$API" ] && return 0
    kill -0 "$DPID" 2>/dev/null || return 1
    sleep 0.1
  done
  fail "$name: emberd neither started nor exited within 15 s"
}

run_job() {  # NAME EMBERCTL-TLS-ARGS...: submit --follow must end SUCCEEDED
  local name=$1; shift
  timeout 150 "$EMBERCTL" --address "$API" "$@" submit "$T/job/tiny.yaml" --follow \
    > "$T/$name-follow.log" 2>&1 || fail "$name: submit --follow"
  grep -q SUCCEEDED "$T/$name-follow.log" || fail "$name: job did not succeed"
  local job
  job=$(head -1 "$T/$name-follow.log")
  for r in 0 1; do
    timeout 30 "$EMBERCTL" --address "$API" "$@" logs "$job" --rank $r > "$T/$name-rank$r.out" 2>&1 ||
      fail "$name: emberctl logs --rank $r"
    grep -q "ember: attempt 0 rank $r" "$T/$name-rank$r.out" || fail "$name: log of rank $r"
  done
}

stop() { kill -INT "$1" 2>/dev/null; for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; kill -KILL "$1"; }

# --- TLS (server certificates only) ---------------------------------------------------------------
start_store tls --tls-cert="$P/node.crt" --tls-key="$P/node.key"
grep -q "tls: on" "$T/tls-store.log" || fail "ember-store logs tls: on"

# A plaintext store client (emberd without TLS) fails at start, naming TLS.
start_emberd plain && fail "a plaintext emberd must not start against a TLS store"
grep -q "serves TLS but this client connects without TLS" "$T/plain-emberd.log" ||
  fail "plaintext emberd: unclear error"

start_emberd tls --tls-cert="$P/node.crt" --tls-key="$P/node.key" --tls-ca="$P/ca.crt" \
  --tls-verify-clients=false || fail "TLS emberd did not start"

out=$("$EMBERCTL" --address "$API" nodes 2>&1); rc=$?
[ $rc -eq 2 ] || fail "plaintext emberctl against TLS emberd: rc=$rc, want 2 ($out)"
echo "$out" | grep -q "serves TLS" || fail "plaintext emberctl: unclear error: $out"

run_job tls --tls-ca "$P/ca.crt"
stop "$DPID"

# --- mTLS (client certificates required) ----------------------------------------------------------
start_store mtls --tls-cert="$P/node.crt" --tls-key="$P/node.key" --tls-ca="$P/ca.crt"
grep -q "tls: mutual" "$T/mtls-store.log" || fail "ember-store logs tls: mutual"
SLOTS=1
WORK="$T/mtls-jobs"  # shared, as multi-node jobs need (every rank writes the final checkpoint)
start_emberd mtls-b --tls-cert="$P/node.crt" --tls-key="$P/node.key" --tls-ca="$P/ca.crt" ||
  fail "second mTLS emberd did not start"
BPID=$DPID
start_emberd mtls --tls-cert="$P/node.crt" --tls-key="$P/node.key" --tls-ca="$P/ca.crt" ||
  fail "mTLS emberd did not start"

for who in none rogue; do
  args=(--tls-ca "$P/ca.crt")
  [ $who = rogue ] && args+=(--tls-cert "$P/rogue.crt" --tls-key "$P/rogue.key")
  out=$(timeout 30 "$EMBERCTL" --address "$API" "${args[@]}" nodes 2>&1); rc=$?
  [ $rc -eq 3 ] || fail "mTLS emberd, client certificate $who: rc=$rc, want 3 ($out)"
  echo "$out" | grep -q "requires client certificates (mTLS)" || fail "$who: unclear error: $out"
done

# The certificate paths from the environment, as a user's shell profile would set them.
EMBER_TLS_CA="$P/ca.crt" EMBER_TLS_CERT="$P/client.crt" EMBER_TLS_KEY="$P/client.key" run_job mtls
grep -q "Nodes\|rank" "$T/mtls-follow.log" || true
grep -q "started ranks 1..1 on mtls-b" "$T/mtls-b-emberd.log" || fail "mtls: rank 1 did not run on mtls-b"
stop "$DPID"
stop "$BPID"

# --- mTLS with the store hosted by emberd (host_store: true) ---------------------------------------
SLOTS=2; WORK=""; STORE_ADDR=""
start_emberd hosted --host-store --store-listen=127.0.0.1:0 --tls-cert="$P/node.crt" \
  --tls-key="$P/node.key" --tls-ca="$P/ca.crt" || fail "emberd --host-store with mTLS did not start"
run_job hosted --tls-ca "$P/ca.crt" --tls-cert "$P/client.crt" --tls-key "$P/client.key"
stop "$DPID"

# --- a TLS client against a plaintext server ------------------------------------------------------
start_store plain --insecure-no-auth
out=$("$EMBERCTL" --address "$STORE_ADDR" --tls-ca "$P/ca.crt" nodes 2>&1); rc=$?
[ $rc -eq 2 ] || fail "TLS emberctl against a plaintext server: rc=$rc, want 2 ($out)"
echo "$out" | grep -q "serves plaintext (no TLS) but this client connects with TLS" ||
  fail "TLS emberctl against a plaintext server: unclear error: $out"
echo PASS
