#!/usr/bin/env bash
# `emberctl run --standalone --emulate-gpus N` (issue 34): a cuda job on N emulated GPUs in CPU CI.
#   * a job that is not a cuda job is refused before any worker is forked, naming
#     resources.device_type;
#   * a 2-rank cuda job runs on ember-worker-cuda-interp (found through the runfiles, as emberctl
#     finds ember-worker): rank r is placed on cuda:r, EMBER_EMULATE_GPUS=1 reaches it, it trains
#     data parallel on the interpreter (gradients all-reduced over the nccl policy backend on the
#     cpu communicator driver) and the job succeeds. Numerics against cpu ranks:
#     //runtime/worker:cuda_dp_interp_test.
#   * kill -9 of one emulated cuda rank after the step-2 checkpoint: the daemon restarts the
#     attempt (max_restarts 1), the ranks resume from the checkpoint and the job ends on the loss of
#     the same job run without the kill.
# Loopback only; every wait bounded; every process this test started is killed on exit.
set -uo pipefail
EMBERCTL="$PWD/$1"; CORPUS="$PWD/$2"  # absolute: the test runs in its own directory
T="${TEST_TMPDIR:-$(mktemp -d)}/emulated"
mkdir -p "$T"
fail() { echo "FAIL: $*" >&2; exit 1; }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done; true; }
trap cleanup EXIT
cp "$CORPUS" "$T/tiny_corpus.txt"
spec() {  # name device_type [steps [extra]]
  printf 'name: %s\nmodel: {vocab_size: 256, context_length: 16, n_layers: 1, n_heads: 1, d_model: 32}\ndata: {text_path: tiny_corpus.txt}\nparallelism: {strategy: fsdp, world_size: 2}\nresources: {device_type: %s}\nsteps: %s\nbatch_size: 2\nthreads: 1\nlog_every: 1\n%b' "$1" "$2" "${3:-3}" "${4:-}"
}
# pid of the live process with EMBER_JOB_ID=$1 and EMBER_RANK=$2 in its environment
rank_pid() {
  for f in $(grep -lzxF "EMBER_JOB_ID=$1" /proc/[0-9]*/environ 2>/dev/null); do
    grep -qzxF "EMBER_RANK=$2" "$f" 2>/dev/null && { echo "$f" | cut -d/ -f3; return; }
  done
}
# the loss of step $2 in $1 (a metrics/rank-0.jsonl)
loss_at() { grep "\"step\":\"$2\"" "$1" | tail -1 | grep -o '"loss":[0-9.e+-]*' | cut -d: -f2; }
cd "$T" || fail "cd $T"

# 1. Not a cuda job: refused at once.
spec emu-cpu cpu > cpu.yaml
out=$(timeout 30 "$EMBERCTL" run --standalone --emulate-gpus 2 --work-root "$T/cpu" cpu.yaml 2>&1); rc=$?
[ $rc -eq 2 ] || fail "cpu job with --emulate-gpus: rc=$rc (want 2): $out"
echo "$out" | grep -q "resources.device_type: 'cpu' with --emulate-gpus 2" || fail "message names the field: $out"
[ -z "$(ls "$T/cpu" 2>/dev/null | grep -v '^\.emberd$')" ] || fail "a job directory was made: $(ls -a "$T/cpu")"

# 2. A 2-rank cuda job on 2 emulated GPUs (checkpoints every 2 steps, one restart allowed: the
#    reference of 3.).
ft='checkpoint: {every_steps: 2}\nmax_restarts: 1\n'
spec emu cuda 6 "$ft" > cuda.yaml
out=$(timeout 120 "$EMBERCTL" run --standalone --emulate-gpus 2 --work-root "$T/jobs" cuda.yaml 2>&1); rc=$?
[ $rc -eq 0 ] || { cat "$T"/jobs/*/logs/rank-*.log 2>/dev/null; fail "emulated 2-rank job: rc=$rc: $out"; }
echo "$out" | grep -q "SUCCEEDED" || fail "not SUCCEEDED: $out"
for r in 0 1; do
  log=$(cat "$T"/jobs/emu-*/logs/rank-$r.log)
  echo "$log" | grep -q "device cuda:$r ===" || fail "rank $r not placed on cuda:$r: $log"
  echo "$log" | grep -q "training on cuda:$r (GptCuda, fp32, data parallel over 2 ranks (replicated; gradients all-reduced on the device, nccl)) on the CUDA interpreter" \
    || fail "rank $r did not train data parallel on the interpreter: $log"
  echo "$log" | grep -q "step 6/6" || fail "rank $r: no step 6: $log"
done
want=$(loss_at "$(ls "$T"/jobs/emu-*/metrics/rank-0.jsonl)" 6)
[ -n "$want" ] || fail "no step-6 loss"

# 3. kill -9 of rank 1: restarted from the checkpoint, ends on the uninterrupted loss (2.'s).
spec emu-kill cuda 6 "$ft" > kill.yaml
"$EMBERCTL" run --standalone --emulate-gpus 2 --work-root "$T/kill" kill.yaml > "$T/kill.out" 2> "$T/kill.err" &
CPID=$!
PIDS+=("$CPID")
killed=""
for _ in $(seq 1200); do  # up to 120 s: the step-2 checkpoint is committed, then rank 1 dies
  if ls -d "$T"/kill/emu-kill-*/checkpoints/step-2 >/dev/null 2>&1; then
    JOB=$(basename "$(ls -d "$T"/kill/emu-kill-*)")
    pid=$(rank_pid "$JOB" 1)
    if [ -n "$pid" ]; then kill -KILL "$pid" && killed="$pid"; break; fi
  fi
  sleep 0.1
done
[ -n "$killed" ] || { cat "$T/kill.err"; fail "rank 1 was not found to kill after the step-2 checkpoint"; }
for _ in $(seq 1800); do kill -0 "$CPID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$CPID" 2>/dev/null && fail "emberctl still running 180 s after the kill"
wait "$CPID"; rc=$?
[ $rc -eq 0 ] || { cat "$T/kill.err"; fail "killed job: rc=$rc (want 0 after the restart)"; }
m="$(ls "$T"/kill/emu-kill-*/metrics/rank-0.jsonl)"
grep -q '"step":"6".*"attempt":1' "$m" || fail "step 6 was not trained by attempt 1: $(cat "$m")"
got=$(loss_at "$m" 6)
awk -v g="$got" -v w="$want" 'BEGIN { d = g - w; if (d < 0) d = -d; a = w < 0 ? -w : w; exit !(d <= 1e-6 * a) }' \
  || fail "step-6 loss $got after the restart, $want without the kill"
echo "kill -9 of rank 1 (pid $killed): restarted, step-6 loss $got (uninterrupted $want)"
echo PASS
