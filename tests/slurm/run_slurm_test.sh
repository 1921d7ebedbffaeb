#!/usr/bin/env bash
# `emberctl run --slurm` in a real allocation (a private slurmctld and 2 slurmd, slurm_cluster.sh):
#   1. a job larger than the allocation is refused before anything starts, naming both numbers;
#   2. sbatch -N2 --ntasks-per-node=2 of a 4-rank tiny GPT: SUCCEEDED, two ranks on each node,
#      the same loss at every step as the same spec run with `emberctl run --standalone`, and
#      nothing of it left running;
#   3. the same job from `salloc -N2 --ntasks-per-node=2 emberctl run --slurm`: the same losses.
set -uo pipefail
EMBERCTL="$(realpath "$1")"; WORKER="$(realpath "$2")"; CORPUS="$3"
HERE="$(dirname "$0")"
. "$HERE/slurm_cluster.sh"
. "$HERE/slurm_lib.sh"
T="${TEST_TMPDIR:-$(mktemp -d)}/run_slurm"
rm -rf "$T"; mkdir -p "$T/w"
fail() { echo "FAIL: $*" >&2; for f in "$T"/w/*.out; do echo "--- $f"; cat "$f"; done >&2; exit 1; }
trap 'slurm_stop "$T/slurm"' EXIT
export EMBER_WORKER="$WORKER"
cp "$CORPUS" "$T/w/tiny_corpus.txt"
slurm_spec tiny-slurm 4 6 > "$T/w/tiny.yaml"
printf '#!/bin/bash\nexec %s run --slurm --work-root %s %s\n' "$EMBERCTL" "$T/w/jobs" "$T/w/tiny.yaml" > "$T/w/job.sh"

# The reference: the same spec on this machine, standalone.
timeout 60 "$EMBERCTL" run --standalone --work-root "$T/w/ref" "$T/w/tiny.yaml" > "$T/w/ref.out" 2>&1 \
  || fail "standalone run failed"
ref=$(losses "$T"/w/ref/tiny-slurm-*/metrics/rank-0.jsonl)
[ "$(echo "$ref" | wc -l)" -eq 6 ] || fail "standalone: 6 steps of loss expected: $ref"

slurm_start "$T/slurm" || fail "slurm_start"
cd "$T/w"

# 1. 4 ranks in an allocation of 2 nodes x 1 CPU: refused, nothing started.
id=$(sbatch --parsable -N2 --ntasks-per-node=1 -o "$T/w/small.out" job.sh) || fail "sbatch"
st=$(wait_slurm_job "$id" 30)
[ "$st" = FAILED ] || fail "too large: job $id is $st (want FAILED)"
[ "$(slurm_exit_code "$id")" = "2:0" ] || fail "too large: exit $(slurm_exit_code "$id") (want 2:0, usage)"
grep -q "asks for 4 ranks but Slurm allocation $id holds 2 CPUs" small.out || fail "refusal names both numbers"
[ ! -e "$T/w/jobs/.slurm-$id" ] || fail "too large: the node daemons' run directory was made"
grep -q "starting the node daemons" small.out && fail "too large: daemons were started"

# 2. 2 nodes x 2 ranks.
t0=$(date +%s%N)
id=$(sbatch --parsable -N2 --ntasks-per-node=2 -o "$T/w/run.out" job.sh) || fail "sbatch"
st=$(wait_slurm_job "$id" 60)
echo "sbatch to done: $(( ($(date +%s%N) - t0) / 1000000 )) ms"
[ "$st" = COMPLETED ] || fail "job $id is $st (want COMPLETED)"
[ "$(slurm_exit_code "$id")" = "0:0" ] || fail "exit $(slurm_exit_code "$id")"
grep -q "SUCCEEDED" run.out || fail "no SUCCEEDED in the output"
grep -q "attempt 0 ran on ember-n1\[cpu:0,cpu:1\] ember-n2\[cpu:0,cpu:1\]" run.out \
  || fail "2 ranks on each node expected: $(grep 'ran on' run.out)"
got=$(losses "$T"/w/jobs/tiny-slurm-*/metrics/rank-0.jsonl)
[ "$got" = "$ref" ] || fail "losses differ from standalone:
slurm:
$got
standalone:
$ref"
echo "final loss $(echo "$got" | tail -1) (standalone: $(echo "$ref" | tail -1))"
left=$(env_pids "EMBER_JOB_ID=$(basename "$T"/w/jobs/tiny-slurm-*)"; cmd_pids "$T/w/jobs/.slurm-$id")
[ -z "$left" ] || fail "left running: $left"

# 3. The same from an salloc shell (emberctl on the submitting host, the daemons on the nodes).
timeout 60 salloc -N2 --ntasks-per-node=2 "$EMBERCTL" run --slurm --work-root "$T/w/salloc" \
  "$T/w/tiny.yaml" > "$T/w/salloc.out" 2>&1 || fail "salloc run: exit $?"
got=$(losses "$T"/w/salloc/tiny-slurm-*/metrics/rank-0.jsonl)
[ "$got" = "$ref" ] || fail "salloc: losses differ from standalone: $got"
echo PASS
