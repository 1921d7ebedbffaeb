#!/usr/bin/env bash
# `emberctl slurm sbatch`: the script it prints with --dry-run (checked line by line against the
# one written here by hand), its refusals, and a real submission that runs to SUCCEEDED on 2 nodes.
set -uo pipefail
EMBERCTL="$(realpath "$1")"; WORKER="$(realpath "$2")"; CORPUS="$3"
HERE="$(dirname "$0")"
. "$HERE/slurm_cluster.sh"
. "$HERE/slurm_lib.sh"
T="${TEST_TMPDIR:-$(mktemp -d)}/sbatch"
rm -rf "$T"; mkdir -p "$T/w"
fail() { echo "FAIL: $*" >&2; for f in "$T"/w/*.out; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done >&2; exit 1; }
trap 'slurm_stop "$T/slurm"' EXIT
export EMBER_WORKER="$WORKER"
cp "$CORPUS" "$T/w/tiny_corpus.txt"
slurm_spec tiny-sb 4 4 > "$T/w/tiny.yaml"
cd "$T/w"

# 1. --dry-run prints the script and submits nothing (no cluster is running yet).
out=$("$EMBERCTL" slurm sbatch tiny.yaml --nodes 2 --time 0:05:00 --partition ember \
  --work-root "$T/w/jobs" --dry-run) || fail "dry run: exit $?"
want="#!/bin/bash
# Written by \`emberctl slurm sbatch\`: Ember on Slurm (docs/operations.md).
#SBATCH --job-name=tiny-sb
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --time=0:05:00
#SBATCH --partition=ember
#SBATCH --output=tiny-sb-%j.out
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
exec '$EMBERCTL' run --slurm --work-root '$T/w/jobs' '$T/w/tiny.yaml'"
[ "$out" = "$want" ] || fail "dry run printed:
$out
want:
$want"
[ ! -e tiny-sb.sbatch ] || fail "dry run wrote a script"

# 2. Refusals (exit 2, before sbatch): more nodes than ranks; GPUs for a cpu job.
out=$("$EMBERCTL" slurm sbatch tiny.yaml --nodes 5 --dry-run 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "5 nodes for 4 ranks" || fail "--nodes 5: rc=$rc $out"
out=$("$EMBERCTL" slurm sbatch tiny.yaml --gpus-per-node 1 --dry-run 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "gpus-per-node is for a cuda job" || fail "--gpus-per-node: rc=$rc $out"

# 3. A real submission.
slurm_start "$T/slurm" || fail "slurm_start"
id=$("$EMBERCTL" slurm sbatch tiny.yaml --nodes 2 --work-root "$T/w/jobs" 2>"$T/w/submit.err") \
  || fail "submit: $(cat "$T/w/submit.err")"
[[ "$id" =~ ^[0-9]+$ ]] || fail "printed '$id', not a Slurm job id"
[ -f tiny-sb.sbatch ] || fail "no tiny-sb.sbatch written"
st=$(wait_slurm_job "$id" 60)
[ "$st" = COMPLETED ] || fail "job $id is $st"
grep -q "SUCCEEDED" "tiny-sb-$id.out" || fail "no SUCCEEDED in tiny-sb-$id.out"
grep -q "ran on ember-n1\[cpu:0,cpu:1\] ember-n2\[cpu:0,cpu:1\]" "tiny-sb-$id.out" || fail "placement"
[ "$(scontrol show job "$id" -o | grep -o 'NumNodes=[0-9]*')" = "NumNodes=2" ] || fail "not 2 nodes"
echo PASS
