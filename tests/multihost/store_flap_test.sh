#!/usr/bin/env bash
# Issue 20: the store unreachable for a while. Two hosts run a 2-node x 2-rank FSDP job of the
# real ember-worker (lease 3 s, checkpoints every 25 steps, max_restarts 1); the store's own link
# goes down (ip link set eth0 down in its namespace), so every daemon and worker loses the store
# while the hosts still reach each other.
#   1. A flap shorter than the lease (FLAP_S, default 2.0 s): daemons and workers ride through.
#      emberd's lease keeper refreshes every 0.3 s (lease / 10) and redials a fresh connection per
#      failed try, so a drop up to ~2.4 s (lease - 2 refresh periods) keeps the lease; 2.4 s rode
#      through 3/3 in development, 2.6 s lost the node in 1 of 2. Checked: still attempt 0,
#      RUNNING, and the job steps on after the link is back.
#   2. A drop longer than the lease (DROP_S, default 6 s): every node lease expires in the store.
#      Each daemon stops its ranks with "node lost: <node>" once its lease must have expired (lease
#      since its last acknowledged refresh + one try) and registers again when the link returns;
#      checked: exactly one restart with that reason, attempt 1 resumed from a checkpoint,
#      SUCCEEDED.
# Prints the measured times. Needs root: skips otherwise.
set -u
# Two flaps, a restart and a resume: ~50 s alone, twice that on a loaded machine.
export MH_DEADLINE_S="${MH_DEADLINE_S:-200}"
source "$(dirname "$0")/netns.sh"
mh_init 2 mhf "$@"
FLAP_S=${FLAP_S:-2.0}
DROP_S=${DROP_S:-6}
STEPS=3000  # ~5 ms a step: enough that the job cannot finish during the 6 s drop
mh_ckpt_job mh-flap "$STEPS"
dump() { mh_ctl 1 --output json status "$JOB"; tail -n 5 "$T"/host*.log "$T/store.log"; }
step() { mh_job "$JOB" 'print(int(j.get("progress",{}).get("metrics",{}).get("step",0)))' 2>/dev/null || echo 0; }
wait_step() {  # wait_step N SECONDS: until the job's progress reaches step N
  for _ in $(seq $(( $2 * 10 ))); do
    [ "$(step)" -ge "$1" ] && return 0
    sleep 0.1
  done
  return 1
}
wait_step 30 30 || { dump; fail "job did not reach step 30"; }

# 1. A short flap of the store's link.
S0=$(step)
mh_link 0 down
sleep "$FLAP_S"
mh_link 0 up
UP=$(date +%s.%N)
wait_step $(( S0 + 20 )) 20 || { dump; fail "no progress after a ${FLAP_S} s store flap (step $(step), was $S0)"; }
AGAIN_S=$(echo "$(date +%s.%N) - $UP" | bc)
sleep 1
RIDE=$(mh_job "$JOB" 'print(j["state"], len(j["attempts"]))')
[ "$RIDE" = "RUNNING 1" ] || { dump; fail "after a ${FLAP_S} s store flap: '$RIDE', want 'RUNNING 1' (rode through)"; }
! grep -h "expired in the store\|node lost" "$T"/host*.log \
  || { dump; fail "a lease expired in a ${FLAP_S} s store flap (lease 3 s)"; }
echo "flap ${FLAP_S} s: rode through (attempt 0 RUNNING); 20 more steps ${AGAIN_S} s after the link came back"

# 2. A drop longer than the lease: a node loss, one restart.
wait_step $(( S0 + 60 )) 30 || { dump; fail "job stalled before the long drop"; }
mh_link 0 down
DOWN=$(date +%s.%N)
sleep "$DROP_S"
mh_link 0 up
# Every node's lease expires at once here; each daemon stops its ranks once its lease must have
# expired and registers again when the link returns: one restart, every time.
RESTARTED=""
for _ in $(seq 300); do
  OUT=$(mh_job "$JOB" 'print(j["state"], len(j["attempts"]))')
  case "$OUT" in "RUNNING 2"|"RESTARTING 2") RESTARTED=$(date +%s.%N); break ;; SUCCEEDED*|FAILED*) break ;; esac
  sleep 0.1
done
[ -n "$RESTARTED" ] || { dump; fail "after a ${DROP_S} s store drop: '$OUT', want a restart (attempt 1)"; }
FINAL=""
for _ in $(seq 900); do
  FINAL=$(mh_job "$JOB" 'print(j["state"], j.get("progress",{}).get("metrics",{}).get("step",0), len(j["attempts"]))')
  case "$FINAL" in SUCCEEDED*|FAILED*|CANCELLED*) break ;; esac
  sleep 0.1
done
REASON=$(mh_job "$JOB" 'print(j["attempts"][0].get("reason",""))')
echo "$REASON" | grep -q "node lost: host" || { dump; fail "attempt 0 reason '$REASON', want 'node lost: host<i>'"; }
BACK_S=$(echo "$RESTARTED - $DOWN - $DROP_S" | bc)
[ "$FINAL" = "SUCCEEDED $STEPS 2" ] || { dump; fail "final: '$FINAL', want 'SUCCEEDED $STEPS 2' (one restart)"; }
grep -q "lease [0-9]* of host[12] expired in the store" "$T"/host*.log \
  || { dump; fail "no daemon logged its lease expired"; }
RESUMED=$(sed -n '/=== ember: attempt 1 rank 0 /,$p' "$T/jobs/$JOB/logs/rank-0.log" | grep -o "resumed from .* (step [0-9]*" | head -1)
echo "$RESUMED" | grep -q "(step [1-9]" || fail "attempt 1 did not resume from a checkpoint: '$RESUMED'"
echo "PASS: store flap ${FLAP_S} s rode through (20 steps ${AGAIN_S} s after); store drop ${DROP_S} s:" \
  "one restart ($REASON), attempt 1 running ${BACK_S} s after the link came back, $RESUMED, SUCCEEDED"
