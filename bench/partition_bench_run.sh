#!/usr/bin/env bash
# One run of //bench:partition_bench (partition_bench.py drives it): the partition of
# tests/multihost/partition_test.sh, timed. Three hosts (network namespaces, netns.sh); a 2-node x
# 2-rank FSDP job past step 60 (checkpoints every 25); the link of one of its two hosts goes down at
# t0. Waits for: the reachable host's attempt-0 ranks gone; the job RUNNING with attempt 1; every
# attempt-1 rank's metrics record of a step past the last step attempt 0 reached. Then the
# namespaces go (netns.sh's trap).
#
#   partition_bench_run.sh NETNS_SH STORE EMBERD EMBERCTL WORKER CORPUS OUTDIR
#
# Writes OUTDIR/run.env (t0, stop_s, running: date +%s.%N; keep, cut, lease_s, reason) and copies
# the job's metrics/rank-*.jsonl (each step's record: step, attempt, unix_ms) into OUTDIR, where
# partition_bench.py reads the step times. Needs root (netns.sh skips otherwise: exit 0, no run.env).
set -u
source "$1"
shift
OUTDIR="$6"
mh_init 3 "partition_bench" "${@:1:5}"
mh_partition_job 400 60   # sets JOB, KEEP, CUT
[ -n "$(mh_ranks "$KEEP" "$JOB" 0)" ] || fail "no attempt-0 ranks on host$KEEP"
T0=$(date +%s.%N)
mh_link "$CUT" down
STOP_S=$(mh_gone_after "$KEEP" "$JOB" 20 "$T0") \
  || fail "attempt-0 ranks on host$KEEP still running 20 s after the partition"
RUNNING=$(mh_wait_attempt "$JOB" 1) || fail "no attempt 1 running 30 s after the partition"
M="$T/jobs/$JOB/metrics"
# The last step attempt 0 recorded (it cannot pass a step once a host is cut off), then every
# attempt-1 rank's first record past it.
step_of() { sed -n "s/^{\"step\":\"\{0,1\}\([0-9]*\)\"\{0,1\},.*\"attempt\":$1,.*/\1/p"; }
A0=$(cat "$M"/rank-*.jsonl | step_of 0 | sort -n | tail -1)
[ -n "$A0" ] || fail "no attempt-0 step records in $M"
PAST=0
for _ in $(seq 300); do
  PAST=0
  for r in 0 1 2 3; do
    [ "$(step_of 1 < "$M/rank-$r.jsonl" 2>/dev/null | sort -n | tail -1)" -gt "$A0" ] 2>/dev/null \
      && PAST=$((PAST + 1))
  done
  [ "$PAST" = 4 ] && break
  sleep 0.1
done
[ "$PAST" = 4 ] || fail "attempt 1 not past step $A0 on all 4 ranks 30 s after it was RUNNING"
REASON=$(mh_job "$JOB" 'print(j["attempts"][0].get("reason",""))')
echo "$REASON" | grep -q "node lost: host$CUT" || fail "attempt 0 reason '$REASON', want 'node lost: host$CUT'"
NEW=$(mh_job "$JOB" 'print(" ".join(sorted(n["node"] for n in j["attempts"][1]["assignment"]["nodes"])))')
echo "$NEW" | grep -q "host$CUT" && fail "attempt 1 placed on the cut-off host: $NEW"
cp "$M"/rank-*.jsonl "$OUTDIR"/
cat > "$OUTDIR/run.env" <<EOF
t0=$T0
stop_s=$STOP_S
running=$RUNNING
keep=host$KEEP
cut=host$CUT
attempt1_hosts=$NEW
lease_s=$MH_LEASE_S
reason=$REASON
EOF
echo "partition of host$CUT: host$KEEP's ranks gone after $STOP_S s; attempt 1 on $NEW"
