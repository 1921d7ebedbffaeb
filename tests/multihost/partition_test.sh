#!/usr/bin/env bash
# Issue 20: a partition. Three hosts (network namespaces); a 2-node x 2-rank FSDP job of the real
# ember-worker; once past step 60 (checkpoints every 25), the link of one of its two hosts goes
# down (ip link set eth0 down in that namespace). Checked: the ranks on the reachable host of the
# job stop within the lease timeout (3 s) + 5 s; attempt 0 ends with "node lost: <host>"; attempt
# 1 runs on the two reachable hosts, resumes from a checkpoint (step > 0) and the job SUCCEEDS at
# the last step.
# The cut-off host's daemon stops its own attempt-0 ranks once the lease must have expired (lease 3 s
# since its last acknowledged refresh, + one try), without waiting for the store: they are gone
# within 12 s of the cut, before the link returns (measured 7.3 s: SIGTERM at 3.3 s, then the real
# worker's stop watcher, blocked in a store call to the unreachable store, took 3.9 s to act).
# Fencing: with attempt 1 running, the link comes back. A stale writer (6th argument,
# stale_writer.cc) started there with the environment one of the cut-off host's attempt-0 ranks
# had has all its writes refused by the job's fence (attempt 0 < 1): its progress
# record under attempt 0 and under attempt 1, and a checkpoint save of the last step into the job's
# checkpoint directory. The job still succeeds; no checkpoint holds the stale writer's tensor and
# none was moved aside. Needs root: skips otherwise.
set -u
source "$(dirname "$0")/netns.sh"
STALE_WRITER=$(realpath "$6")
mh_init 3 mhp "${@:1:5}"
STEPS=400
mh_partition_job "$STEPS" 60   # sets JOB, KEEP, CUT
json() { mh_ctl 1 --output json status "$JOB" 2>/dev/null; }
echo "job $JOB on host$KEEP host$CUT; cutting off host$CUT"
ranks_of() { mh_ranks "$1" "$JOB" "$2"; }  # ranks_of HOST ATTEMPT
[ -n "$(ranks_of "$KEEP" 0)" ] || fail "no attempt-0 ranks on host$KEEP"
# One of the cut-off host's ranks' environment, for the stale writer.
STALE_PID=$(ranks_of "$CUT" 0 | head -1)
[ -n "$STALE_PID" ] || fail "no attempt-0 rank on host$CUT"
tr '\0' '\n' < "/proc/$STALE_PID/environ" | grep '^EMBER_' > "$T/stale.env"
T0=$(date +%s.%N)
mh_link "$CUT" down
STOP_S=$(mh_gone_after "$KEEP" "$JOB" 8 "$T0") \
  || fail "attempt-0 ranks on host$KEEP still running 8 s after the partition: $(ranks_of "$KEEP" 0)"
CUT_S=$(mh_gone_after "$CUT" "$JOB" 12 "$T0") \
  || fail "attempt-0 ranks on the cut-off host$CUT still running 12 s after the partition (its daemon must stop them once its lease has expired): $(ranks_of "$CUT" 0)"
RUNNING=$(mh_wait_attempt "$JOB" 1) || { json; fail "no attempt 1 running 30 s after the partition"; }
AGAIN_S=$(echo "$RUNNING - $T0" | bc)
REASON=$(mh_job "$JOB" 'print(j["attempts"][0].get("reason",""))')
echo "$REASON" | grep -q "node lost: host$CUT" || fail "attempt 0 reason '$REASON', want 'node lost: host$CUT'"
NEW=$(mh_job "$JOB" 'print(" ".join(sorted(n["node"] for n in j["attempts"][1]["assignment"]["nodes"])))')
echo "$NEW" | grep -q "host$CUT" && fail "attempt 1 placed on the cut-off host: $NEW"

# Fencing: the partition heals while attempt 1 runs.
mh_link "$CUT" up
CKPT="$T/jobs/$JOB/checkpoints"
mh_exec "$CUT" env -i $(cat "$T/stale.env") "$STALE_WRITER" --checkpoint_root="$CKPT" \
  --step="$STEPS" > "$T/stale.out" 2>&1
rc=$?
cat "$T/stale.out"
[ "$rc" = 0 ] || fail "the stale writer got a write through (rc $rc)"
[ "$(grep -c "^refused: .*write refused by fence 'jobs/$JOB/fence': this client belongs to epoch 0, the fence is at epoch 1" "$T/stale.out")" = 3 ] \
  || fail "want 3 writes refused by the fence, attempt 0 vs 1"
[ -e "$CKPT/.tmp-step-$STEPS" ] && fail "the stale writer left $CKPT/.tmp-step-$STEPS"
FINAL=""
for _ in $(seq 600); do
  FINAL=$(mh_job "$JOB" 'print(j["state"], j.get("progress",{}).get("metrics",{}).get("step",0), len(j["attempts"]))' 2>/dev/null)
  case "$FINAL" in SUCCEEDED*|FAILED*|CANCELLED*) break ;; esac
  sleep 0.1
done
[ "$FINAL" = "SUCCEEDED $STEPS 2" ] || { json; fail "final: '$FINAL', want 'SUCCEEDED $STEPS 2'"; }
grep -rl "stale.weight" "$CKPT" && fail "a checkpoint holds the stale writer's tensor"
ls -a "$CKPT" | grep -q '^.superseded-' && fail "a checkpoint step was moved aside: $(ls -a "$CKPT")"
SR=$(sed -n 's/^EMBER_RANK=//p' "$T/stale.env")
STALE_EXIT=$(grep -h "ember-worker\[$STALE_PID\]" "$T/jobs/$JOB/logs/rank-$SR.log" \
  | grep -E "stopping: |stale worker: " | tail -1 | sed 's/ (flight recorder.*//; s/.*\] //')
RESUMED=$(sed -n '/=== ember: attempt 1 rank 0 /,$p' "$T/jobs/$JOB/logs/rank-0.log" | grep -o "resumed from .* (step [0-9]*" | head -1)
echo "$RESUMED" | grep -q "(step [1-9]" || fail "attempt 1 did not resume from a checkpoint: '$RESUMED'"
echo "PASS: partition of host$CUT: ranks on host$KEEP stopped after ${STOP_S} s, attempt 1 on $NEW running after ${AGAIN_S} s, $RESUMED ($REASON)"
echo "PASS: host$CUT cut off: its own attempt-0 ranks stopped by its daemon after ${CUT_S} s ($STALE_EXIT)"
echo "PASS: fencing: link back, the stale writer's 3 writes refused; attempt 1 succeeded untouched"
