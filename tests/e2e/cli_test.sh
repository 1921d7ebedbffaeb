#!/usr/bin/env bash
# emberd and emberctl as binaries: start-up, --help, exit codes (unreachable 3, bad token 4, bad
# spec or unknown option 2, no such job 5), submit --follow to SUCCEEDED, a waiting job's reason,
# cancel, JSON output, SIGTERM drain.
# Loopback only; every step bounded; the daemon is killed on any exit.
set -u  # no pipefail: `cmd | grep -q` closes the pipe early and cmd may die of SIGPIPE
EMBERD="$1"; EMBERCTL="$2"; WORKER="$3"
T="${TEST_TMPDIR:-$(mktemp -d)}/cli"
mkdir -p "$T"
fail() { echo "FAIL: $*" >&2; exit 1; }
DPID=""
cleanup() { [ -n "$DPID" ] && kill -KILL "$DPID" 2>/dev/null; true; }
trap cleanup EXIT

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$T/token"
echo "wrong-token-wrong-token-wrong" > "$T/bad"

"$EMBERCTL" --help | grep -q "run --standalone" || fail "top --help"
# Usage is generated from the command table: `help`, `help CMD` and `CMD --help` agree.
"$EMBERCTL" help | grep -q "ckpt export CKPT OUT" || fail "help lists the commands"
for c in run submit status list logs cancel nodes dump fr ckpt weights; do
  "$EMBERCTL" "$c" --help > "$T/h1" || fail "$c --help"
  grep -q "^usage: emberctl $c" "$T/h1" || fail "$c --help: $(cat "$T/h1")"
  "$EMBERCTL" help "$c" > "$T/h2" || fail "help $c"
  cmp -s "$T/h1" "$T/h2" || fail "help $c differs from $c --help"
done
"$EMBERCTL" ckpt --help | grep -q -- "--max-shard-bytes N" || fail "ckpt --help lists the options"
"$EMBERCTL" bogus >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown command must exit 2"
# Unknown options are usage errors (exit 2, with the command's usage), for every command, before
# anything is read or dialed; an option of another command is unknown too.
for args in "run --standalone --bogus x.yaml" "submit x.yaml --folow" "status --bogus" \
            "list --bogus" "logs j --bogus" "cancel j --force" "nodes --bogus" "dump j --bogus" \
            "fr analyze d --bogus" "ckpt inspect p --bogus" "ckpt export c o --bogus" \
            "list --follow" "submit x.yaml --verify" "--bogus nodes" "weights subscribe j --bogus"; do
  out=$(EMBER_ADDRESS=127.0.0.1:1 "$EMBERCTL" $args 2>&1); rc=$?
  [ $rc -eq 2 ] || fail "'$args': unknown option must exit 2, got $rc ($out)"
  echo "$out" | grep -q "unknown option '--" || fail "'$args' names the option: $out"
  echo "$out" | grep -q "usage:" || fail "'$args' prints the usage: $out"
done
for args in "list --limit lots" "logs j --tail -3" "logs j --rank x" \
            "weights subscribe j --out d" "weights subscribe j --store 127.0.0.1:1" \
            "weights subscribe j --out d --store 127.0.0.1:1 --steps 0"; do
  out=$(EMBER_ADDRESS=127.0.0.1:1 "$EMBERCTL" $args 2>&1); rc=$?
  [ $rc -eq 2 ] || fail "'$args': a bad option value must exit 2, got $rc ($out)"
done
# A token file that does not exist is a token problem: exit 4, naming the file.
out=$(EMBER_ADDRESS=127.0.0.1:1 "$EMBERCTL" --token-file "$T/no-such-token" nodes 2>&1); rc=$?
[ $rc -eq 4 ] || fail "missing token file must exit 4, got $rc ($out)"
echo "$out" | grep -q "no-such-token" || fail "missing token file is named: $out"
"$EMBERD" --work-root="$T/jobs" --worker-binary="$WORKER" --host-store >/dev/null 2>&1
[ $? -eq 2 ] || fail "emberd without a token must refuse (exit 2)"

# Unreachable daemon: exit 3 with a clear message.
out=$(EMBER_ADDRESS=127.0.0.1:1 "$EMBERCTL" --token-file "$T/token" list 2>&1); rc=$?
[ $rc -eq 3 ] || fail "unreachable: rc=$rc ($out)"
echo "$out" | grep -q "cannot reach emberd" || fail "unreachable message: $out"

source tests/e2e/emberd_lib.sh
start_emberd "$T/emberd.log" "$EMBERD" --listen=127.0.0.1:0 --store-listen=127.0.0.1:0 --host-store \
  --node-name=cli --auth-token-file="$T/token" --work-root="$T/jobs" --worker-binary="$WORKER" \
  --cpu-slots=2 --cuda-devices=0 || { fail "emberd did not become ready"; }
ADDR="$API"
export EMBER_ADDRESS="$ADDR"

"$EMBERCTL" --token-file "$T/bad" nodes >/dev/null 2>&1; [ $? -eq 4 ] || fail "bad token must exit 4"
"$EMBERCTL" nodes >/dev/null 2>&1; [ $? -eq 4 ] || fail "missing token must exit 4"
grep -q "UNAUTHENTICATED" "$T/emberd.log" || fail "rejections are logged"

export EMBER_TOKEN_FILE="$T/token"
"$EMBERCTL" nodes | grep -q "cpu:1" || fail "nodes lists devices"
"$EMBERCTL" --output json nodes | grep -q '"cpu_slots": *2' || fail "nodes json"

printf 'name: cli-bad\nsteps: -1\n' > "$T/bad.yaml"
out=$("$EMBERCTL" submit "$T/bad.yaml" 2>&1); rc=$?
[ $rc -eq 2 ] || fail "bad spec: rc=$rc"
echo "$out" | grep -q "steps" || fail "bad spec names the field: $out"

printf 'name: cli-ok\nmodel: {n_layers: 1, d_model: 32, n_heads: 2, context_length: 16}\nparallelism: {strategy: fsdp, world_size: 2}\nsteps: 5\n' > "$T/ok.yaml"
timeout 60 "$EMBERCTL" submit "$T/ok.yaml" --follow > "$T/follow.out" 2>&1 || { cat "$T/follow.out"; fail "submit --follow"; }
grep -q SUCCEEDED "$T/follow.out" || fail "follow shows SUCCEEDED"
JOB=$(head -1 "$T/follow.out")
"$EMBERCTL" status "$JOB" | grep -q SUCCEEDED || fail "status"
"$EMBERCTL" --output json status "$JOB" | grep -q '"state": *"SUCCEEDED"' || fail "status json"
"$EMBERCTL" logs "$JOB" --rank 1 | grep -q "done" || fail "logs --rank"
"$EMBERCTL" status no-such-job >/dev/null 2>&1; [ $? -eq 5 ] || fail "no such job must exit 5"
"$EMBERCTL" weights subscribe no-such-job --out "$T/w" --store 127.0.0.1:1 >/dev/null 2>&1
[ $? -eq 5 ] || fail "weights subscribe of no such job must exit 5"

printf 'name: cli-hang\nmodel: {n_layers: 1, d_model: 32, n_heads: 2, context_length: 16}\nparallelism: {strategy: fsdp, world_size: 2}\nsteps: 5\n' > "$T/hang.yaml"
HJOB=$("$EMBERCTL" submit "$T/hang.yaml" --id cli-hang-1) || fail "submit hang"
HJOB2=$("$EMBERCTL" submit "$T/hang.yaml" --id cli-hang-1) || fail "resubmit"
[ "${HJOB2%% *}" = "$HJOB" ] || fail "idempotent submit: $HJOB vs $HJOB2"
for _ in $(seq 100); do "$EMBERCTL" status "$HJOB" | grep -q "step" && break; sleep 0.1; done
# A job that cannot start now says why in `status`.
WJOB=$("$EMBERCTL" submit "$T/ok.yaml") || fail "submit a waiting job"
for _ in $(seq 50); do "$EMBERCTL" status "$WJOB" | grep -q "waiting: needs 2 cpu devices, 0 free" && break; sleep 0.1; done
"$EMBERCTL" status "$WJOB" | grep -q "PENDING.*(waiting: needs 2 cpu devices, 0 free)" || fail "status shows why a job waits: $("$EMBERCTL" status "$WJOB")"
"$EMBERCTL" cancel "$WJOB" >/dev/null || fail "cancel the waiting job"
"$EMBERCTL" cancel "$HJOB" | grep -q CANCELLED || fail "cancel"

# SIGINT drains and exits 0 (SIGTERM detaches: tests/recovery).
kill -INT "$DPID"
for _ in $(seq 100); do kill -0 "$DPID" 2>/dev/null || break; sleep 0.1; done
wait "$DPID"; rc=$?
DPID=""
[ $rc -eq 0 ] || fail "emberd exit after SIGINT: $rc"
grep -q "draining" "$T/emberd.log" || fail "drain logged"
echo PASS
