#!/usr/bin/env bash
# Issue 20: a partition. Three hosts (network namespaces); a 2-node x 2-rank FSDP job of the real
# ember-worker; once past step 60 (checkpoints every 25), the link of one of its two hosts goes
# down (ip link set eth0 down in that namespace). Checked: the ranks on the reachable host of the
# job stop within the lease timeout (3 s) + 5 s; attempt 0 ends with "node lost: <host>"; attempt
# 1 runs on the two reachable hosts, resumes from a checkpoint (step > 0) and the job SUCCEEDS at
# the last step. Needs root: skips otherwise.
set -u
source "$(dirname "$0")/netns.sh"
mh_init 3 mhp "$@"
STEPS=400
mh_spec mh-part "$STEPS" ", nodes: 2" \
  "checkpoint: {dir: checkpoints, every_steps: 25, keep_last: 2}
max_restarts: 1" > "$T/job.yaml"
mh_cluster "$STORE" "$EMBERD" "$WORKER" "$T"
json() { mh_ctl 1 --output json status "$JOB" 2>/dev/null; }
py() { python3 -c "import json,sys; j=json.load(sys.stdin); $1"; }
for _ in $(seq 100); do
  [ "$(mh_ctl 1 --output json nodes 2>/dev/null | grep -c '"name"')" -ge 3 ] && break
  sleep 0.1
done
JOB=$(mh_ctl 1 submit "$T/job.yaml" | awk '{print $1}')
[ -n "$JOB" ] || fail "submit"
PLACED=""
for _ in $(seq 300); do
  PLACED=$(json | py 'a=j["attempts"][-1]; print(" ".join(sorted(n["node"] for n in a["assignment"]["nodes"])) if int(j.get("progress",{}).get("step",0)) >= 60 else "")' 2>/dev/null)
  [ -n "$PLACED" ] && break
  sleep 0.1
done
[ -n "$PLACED" ] || { json; tail "$T"/host*.log; fail "job did not reach step 60"; }
set -- $PLACED
[ $# -eq 2 ] || fail "placed on '$PLACED', want 2 hosts"
KEEP=${1#host}; CUT=${2#host}   # host1 (the API used here) is never the one cut off
echo "job $JOB on $PLACED; cutting off host$CUT"

# The attempt-0 ranks on the reachable host of the job.
ranks_of() {  # ranks_of HOST ATTEMPT: pids in namespace HOST of this job's attempt ATTEMPT
  local p
  for p in $(ip netns pids "${MH}-$1" 2>/dev/null); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "EMBER_JOB_ID=$JOB" || continue
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "EMBER_ATTEMPT=$2" || continue
    [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = Z ] && continue
    echo "$p"
  done
}
[ -n "$(ranks_of "$KEEP" 0)" ] || fail "no attempt-0 ranks on host$KEEP"
T0=$(date +%s.%N)
mh_link "$CUT" down
STOPPED=""
for _ in $(seq 160); do
  [ -z "$(ranks_of "$KEEP" 0)" ] && { STOPPED=$(date +%s.%N); break; }
  sleep 0.05
done
[ -n "$STOPPED" ] || fail "attempt-0 ranks on host$KEEP still running 8 s after the partition: $(ranks_of "$KEEP" 0)"
STOP_S=$(echo "$STOPPED - $T0" | bc)
RUNNING=""
for _ in $(seq 300); do
  json | py 'sys.exit(0 if len(j["attempts"]) >= 2 and j["state"] == "RUNNING" else 1)' 2>/dev/null \
    && { RUNNING=$(date +%s.%N); break; }
  sleep 0.1
done
[ -n "$RUNNING" ] || { json; fail "no attempt 1 running 30 s after the partition"; }
AGAIN_S=$(echo "$RUNNING - $T0" | bc)
REASON=$(json | py 'print(j["attempts"][0].get("reason",""))')
echo "$REASON" | grep -q "node lost: host$CUT" || fail "attempt 0 reason '$REASON', want 'node lost: host$CUT'"
NEW=$(json | py 'print(" ".join(sorted(n["node"] for n in j["attempts"][1]["assignment"]["nodes"])))')
echo "$NEW" | grep -q "host$CUT" && fail "attempt 1 placed on the cut-off host: $NEW"
FINAL=""
for _ in $(seq 600); do
  FINAL=$(json | py 'print(j["state"], j.get("progress",{}).get("step",0), len(j["attempts"]))' 2>/dev/null)
  case "$FINAL" in SUCCEEDED*|FAILED*|CANCELLED*) break ;; esac
  sleep 0.1
done
[ "$FINAL" = "SUCCEEDED $STEPS 2" ] || { json; fail "final: '$FINAL', want 'SUCCEEDED $STEPS 2'"; }
RESUMED=$(sed -n '/=== ember: attempt 1 rank 0 /,$p' "$T/jobs/$JOB/logs/rank-0.log" | grep -o "resumed from .* (step [0-9]*" | head -1)
echo "$RESUMED" | grep -q "(step [1-9]" || fail "attempt 1 did not resume from a checkpoint: '$RESUMED'"
echo "PASS: partition of host$CUT: ranks on host$KEEP stopped after ${STOP_S} s, attempt 1 on $NEW running after ${AGAIN_S} s, $RESUMED ($REASON)"
