#!/usr/bin/env bash
# A node set DOWN mid-run (`scontrol update nodename=ember-n2 state=down`): Slurm ends the job's
# steps (NODE_FAIL) and requeues the batch job (JobRequeue); nothing of the job stays running
# (a node daemon whose store is gone also stops itself), and the requeued run, once the node is
# back, resumes from the checkpoint and SUCCEEDS.
set -uo pipefail
EMBERCTL="$(realpath "$1")"; WORKER="$(realpath "$2")"; CORPUS="$3"
HERE="$(dirname "$0")"
. "$HERE/slurm_cluster.sh"
. "$HERE/slurm_lib.sh"
T="${TEST_TMPDIR:-$(mktemp -d)}/node_down"
rm -rf "$T"; mkdir -p "$T/w"
fail() { echo "FAIL: $*" >&2; [ -n "${id:-}" ] && scontrol show job "$id" >&2; for f in "$T"/w/*.out; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done >&2; exit 1; }
trap 'slurm_stop "$T/slurm"' EXIT
export EMBER_WORKER="$WORKER"
cp "$CORPUS" "$T/w/tiny_corpus.txt"
STEPS=300
slurm_spec tiny-nd 4 $STEPS 10 > "$T/w/tiny.yaml"
printf '#!/bin/bash\nexec %s run --slurm --work-root %s %s\n' "$EMBERCTL" "$T/w/jobs" "$T/w/tiny.yaml" > "$T/w/job.sh"
SLURM_TEST_KILL_WAIT=30 slurm_start "$T/slurm" || fail "slurm_start"
cd "$T/w"
id=$(sbatch --parsable -N2 --ntasks-per-node=2 --open-mode=append -o "$T/w/run.out" job.sh) || fail "sbatch"
for _ in $(seq 300); do  # the job directory: <name>-slurm-<cluster>-<Slurm job id>
  JOBDIR=$(ls -d "$T"/w/jobs/tiny-nd-slurm-*-"$id" 2>/dev/null) && break
  sleep 0.1
done
[ -n "$JOBDIR" ] || fail "no job directory tiny-nd-slurm-*-$id"
JOB=$(basename "$JOBDIR")
M="$JOBDIR/metrics/rank-0.jsonl"
for _ in $(seq 600); do
  [ "$(losses "$M" 2>/dev/null | wc -l)" -ge 25 ] && break
  sleep 0.1
done
at=$(losses "$M" | tail -1 | cut -d' ' -f1)
[ -n "$at" ] && [ "$at" -ge 25 ] && [ "$at" -lt "$STEPS" ] || fail "not mid-run (step '$at')"
scontrol update nodename=ember-n2 state=down reason=ember-test || fail "scontrol update"
echo "ember-n2 set DOWN at step $at"
t0=$(date +%s%N)
gone=""
while [ $(( ($(date +%s%N) - t0) / 1000000 )) -lt 30000 ]; do
  if [ -z "$(env_pids "EMBER_JOB_ID=$JOB"; cmd_pids "$T/w/jobs")" ]; then
    gone=$(( ($(date +%s%N) - t0) / 1000000 )); break
  fi
  sleep 0.1
done
[ -n "$gone" ] || fail "still running 30 s after the node went down: $(env_pids "EMBER_JOB_ID=$JOB"; cmd_pids "$T/w/jobs")"
echo "nothing of the job running ${gone} ms after ember-n2 went DOWN"
# emberctl prints Slurm's reason ("stopped by Slurm: node ember-n2 is DOWN (Reason=...)") when it
# can: on a node failure Slurm requeues the job and kills the batch step within ~0.2 s, sometimes
# before that line is out, so it is shown here but not required.
grep "stopped by Slurm" run.out || echo "(emberctl was killed before it could name the node)"
# Slurm requeued it (node failure); with the node back, the requeued run resumes and succeeds.
for _ in $(seq 300); do
  scontrol show job "$id" -o | grep -q 'JobState=PENDING.*Restarts=1' && break
  sleep 0.1
done
scontrol show job "$id" -o | grep -q 'Restarts=1' || fail "not requeued after the node failure"
for _ in $(seq 100); do  # refused while the node still completes the killed job
  err=$(scontrol update nodename=ember-n2 state=resume 2>&1) && break
  sleep 0.1
done
sinfo -h -n ember-n2 -o %T | grep -qiv down || fail "resume ember-n2: $err; $(sinfo -N)"
for _ in $(seq 300); do  # the first run fully ended on both nodes (not COMPLETING)
  [ "$(sinfo -h -N -o %T | grep -c '^idle$')" -eq 2 ] && break
  sleep 0.1
done
# slurmd refuses a credential of the job made within the second its old one was revoked ("Job
# credential revoked"): part of why Slurm itself waits two minutes.
sleep 3
scontrol update JobId="$id" StartTime=now || fail "StartTime=now"
st=$(wait_slurm_job "$id" 60)
[ "$st" = COMPLETED ] || fail "requeued job $id is $st"
grep -aq "resumed from $JOBDIR/checkpoints/step-" "$JOBDIR/logs/rank-0.log" || fail "did not resume"
[ "$(losses "$M" | tail -1 | cut -d' ' -f1)" = "$STEPS" ] || fail "did not reach step $STEPS"
echo PASS
