#!/usr/bin/env bash
# The time-limit warning mid-run (what sbatch --signal=B:USR1@T sends; here `scancel --batch
# --signal=USR1`, at a chosen moment): emberctl has the job checkpoint the next step every rank
# reaches and stop (cancel --checkpoint), requeues the Slurm job, and the requeued run resumes
# from that checkpoint (at or after the step at the signal: no step lost, none redone) and
# finishes with the uninterrupted run's final loss (deterministic: true; the reference is a
# standalone run).
set -uo pipefail
EMBERCTL="$(realpath "$1")"; WORKER="$(realpath "$2")"; CORPUS="$3"
HERE="$(dirname "$0")"
. "$HERE/slurm_cluster.sh"
. "$HERE/slurm_lib.sh"
T="${TEST_TMPDIR:-$(mktemp -d)}/requeue"
rm -rf "$T"; mkdir -p "$T/w"
fail() { echo "FAIL: $*" >&2; [ -n "${id:-}" ] && scontrol show job "$id" >&2; for f in "$T"/w/*.out; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done >&2; exit 1; }
trap 'slurm_stop "$T/slurm"' EXIT
export EMBER_WORKER="$WORKER"
cp "$CORPUS" "$T/w/tiny_corpus.txt"
STEPS=200
{ slurm_spec tiny-rq 4 $STEPS 10; echo "deterministic: true"; } > "$T/w/tiny.yaml"
printf '#!/bin/bash\nexec %s run --slurm --work-root %s %s\n' "$EMBERCTL" "$T/w/jobs" "$T/w/tiny.yaml" > "$T/w/job.sh"

timeout 120 "$EMBERCTL" run --standalone --work-root "$T/w/ref" "$T/w/tiny.yaml" > "$T/w/ref.out" 2>&1 \
  || fail "standalone run failed"
ref=$(losses "$T"/w/ref/tiny-rq-*/metrics/rank-0.jsonl | tail -1)
[ "${ref%% *}" = "$STEPS" ] || fail "standalone: last step $ref"

slurm_start "$T/slurm" || fail "slurm_start"
cd "$T/w"
id=$(sbatch --parsable -N2 --ntasks-per-node=2 --requeue --open-mode=append -o "$T/w/run.out" job.sh) \
  || fail "sbatch"
for _ in $(seq 300); do  # the job directory: <name>-slurm-<cluster>-<Slurm job id>
  JOBDIR=$(ls -d "$T"/w/jobs/tiny-rq-slurm-*-"$id" 2>/dev/null) && break
  sleep 0.1
done
[ -n "$JOBDIR" ] || fail "no job directory tiny-rq-slurm-*-$id"
M="$JOBDIR/metrics/rank-0.jsonl"
for _ in $(seq 600); do
  [ "$(losses "$M" 2>/dev/null | wc -l)" -ge 25 ] && break
  sleep 0.1
done
at=$(losses "$M" | tail -1 | cut -d' ' -f1)
[ -n "$at" ] && [ "$at" -ge 25 ] && [ "$at" -lt "$STEPS" ] || fail "not mid-run at the signal (step '$at')"
scancel --batch --signal=USR1 "$id" || fail "scancel --signal=USR1"
echo "warning signal at step $at"
# Slurm makes a requeued job eligible only ~2 minutes later (BeginTime); the test moves that to now.
for _ in $(seq 300); do
  scontrol show job "$id" -o | grep -q 'JobState=PENDING.*Restarts=1' && break
  sleep 0.1
done
scontrol show job "$id" -o | grep -q 'Restarts=1' || fail "not requeued"
for _ in $(seq 300); do  # the first run fully ended on both nodes (not COMPLETING)
  [ "$(sinfo -h -N -o %T | grep -c '^idle$')" -eq 2 ] && break
  sleep 0.1
done
# slurmd refuses a credential of the job made within the second its old one was revoked ("Job
# credential revoked"): part of why Slurm itself waits two minutes.
sleep 3
scontrol update JobId="$id" StartTime=now || fail "scontrol update StartTime=now"
st=$(wait_slurm_job "$id" 60)
[ "$st" = COMPLETED ] || fail "job $id is $st (want COMPLETED after the requeue)"
restarts=$(scontrol show job "$id" -o | grep -o 'Restarts=[0-9]*' | cut -d= -f2)
[ "$restarts" = 1 ] || fail "Restarts=$restarts (want 1)"
grep -q "requeueing Slurm job $id" run.out || fail "no requeue message"
grep -q "checkpointing the next step" run.out || fail "no checkpoint-on-warning message"
[ "$(grep -c 'starting the node daemons' run.out)" -eq 2 ] || fail "want 2 runs in the output"
grep -q SUCCEEDED run.out || fail "the requeued run did not succeed"
# The second run resumed from the first one's checkpoint (the worker logs where from).
resumed=$(grep -ao "resumed from $JOBDIR/checkpoints/step-[0-9]*" "$JOBDIR/logs/rank-0.log" | sed 's/.*step-//' | head -1)
[ -n "$resumed" ] && [ "$resumed" -gt 0 ] && [ "$resumed" -lt "$STEPS" ] \
  || fail "the requeued run did not resume from a checkpoint of the first (resumed: '$resumed')"
got=$(losses "$M" | tail -1)
echo "resumed at step $resumed; final $got (uninterrupted: $ref)"
# Checkpointed on the warning, not the last periodic checkpoint (every 10 steps) before it.
[ "$resumed" -ge "$at" ] || fail "resumed at step $resumed, before the step at the warning ($at): steps lost"
# Every step trained exactly once over the two runs.
dups=$(losses "$M" | cut -d' ' -f1 | sort -n | uniq -d | wc -l)
[ "$dups" -eq 0 ] || fail "$dups steps trained twice (redone after the requeue)"
[ "$got" = "$ref" ] || fail "final loss $got differs from the uninterrupted run's $ref"
echo PASS
