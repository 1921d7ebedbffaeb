#!/usr/bin/env bash
# `emberctl run --standalone --emulate-gpus N` (issue 34): a cuda job on N emulated GPUs in CPU CI.
#   * a job that is not a cuda job is refused before any worker is forked, naming
#     resources.device_type;
#   * a 2-rank cuda job runs on ember-worker-cuda-interp (found through the runfiles, as emberctl
#     finds ember-worker): rank r is placed on cuda:r, EMBER_EMULATE_GPUS=1 reaches it, it trains
#     data parallel on the interpreter (gradients all-reduced over the nccl policy backend on the
#     cpu communicator driver) and the job succeeds. Numerics against cpu ranks:
#     //runtime/worker:cuda_dp_interp_test.
# Loopback only; every wait bounded.
set -uo pipefail
EMBERCTL="$PWD/$1"; CORPUS="$PWD/$2"  # absolute: the test runs in its own directory
T="${TEST_TMPDIR:-$(mktemp -d)}/emulated"
mkdir -p "$T"
fail() { echo "FAIL: $*" >&2; exit 1; }
cp "$CORPUS" "$T/tiny_corpus.txt"
spec() {  # name device_type
  printf 'name: %s\nmodel: {vocab_size: 256, context_length: 16, n_layers: 1, n_heads: 1, d_model: 32}\ndata: {text_path: tiny_corpus.txt}\nparallelism: {strategy: fsdp, world_size: 2}\nresources: {device_type: %s}\nsteps: 3\nbatch_size: 2\nthreads: 1\nlog_every: 1\n' "$1" "$2"
}
cd "$T" || fail "cd $T"

# 1. Not a cuda job: refused at once.
spec emu-cpu cpu > cpu.yaml
out=$(timeout 30 "$EMBERCTL" run --standalone --emulate-gpus 2 --work-root "$T/cpu" cpu.yaml 2>&1); rc=$?
[ $rc -eq 2 ] || fail "cpu job with --emulate-gpus: rc=$rc (want 2): $out"
echo "$out" | grep -q "resources.device_type: 'cpu' with --emulate-gpus 2" || fail "message names the field: $out"
[ -z "$(ls "$T/cpu" 2>/dev/null | grep -v '^\.emberd$')" ] || fail "a job directory was made: $(ls -a "$T/cpu")"

# 2. A 2-rank cuda job on 2 emulated GPUs.
spec emu cuda > cuda.yaml
out=$(timeout 120 "$EMBERCTL" run --standalone --emulate-gpus 2 --work-root "$T/jobs" cuda.yaml 2>&1); rc=$?
[ $rc -eq 0 ] || { cat "$T"/jobs/*/logs/rank-*.log 2>/dev/null; fail "emulated 2-rank job: rc=$rc: $out"; }
echo "$out" | grep -q "SUCCEEDED" || fail "not SUCCEEDED: $out"
for r in 0 1; do
  log=$(cat "$T"/jobs/emu-*/logs/rank-$r.log)
  echo "$log" | grep -q "device cuda:$r ===" || fail "rank $r not placed on cuda:$r: $log"
  echo "$log" | grep -q "training on cuda:$r (GptCuda, fp32, data parallel over 2 ranks (replicated; gradients all-reduced on the device, nccl)) on the CUDA interpreter" \
    || fail "rank $r did not train data parallel on the interpreter: $log"
  echo "$log" | grep -q "step 3/3" || fail "rank $r: no step 3: $log"
done
echo PASS
