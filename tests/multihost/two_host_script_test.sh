#!/usr/bin/env bash
# Issue 23 across hosts: a PyTorch DDP script (tests/script/ddp_train.py, gloo) as a script job of
# 2 hosts x 2 ranks in two network namespaces. Needs root and Debian's torch: skips otherwise.
#   1. The script checks torchrun's contract for 2 nodes itself (RANK = GROUP_RANK x
#      LOCAL_WORLD_SIZE + LOCAL_RANK, WORLD_SIZE 4, MASTER_ADDR not loopback and answering from the
#      other host); the job SUCCEEDS on host1+host2, MASTER_ADDR is the address of the host running
#      rank 0 and gloo binds each host's eth0 (GLOO_SOCKET_IFNAME from the daemon); the losses
#      equal the one-process simulation of the same 4-rank DDP run (the reference of
#      tests/script's restart mode) within 1e-5 relative.
#   2. kill -9 of a rank on the host that does not run rank 0: attempt 1 on both hosts with
#      TORCHELASTIC_RESTART_COUNT=1, resumed from the script's checkpoint, SUCCEEDED, the same
#      losses.
# Arguments: STORE EMBERD EMBERCTL WORKER CORPUS SCRIPT.
set -u
source "$(dirname "$0")/netns.sh"
PY=/usr/bin/python3
SCRIPT=$(realpath "$6")
"$PY" -c "import torch.distributed" 2>/dev/null || mh_skip "no torch for $PY (python3-torch)"
MH_DEADLINE_S=85
mh_init 2 mhs "$@"
cp "$SCRIPT" "$T/ddp_train.py"

# spec NAME STEPS MAX_RESTARTS EXTRA_ARGS: the script job, 4 ranks on 2 nodes (2 cpu slots each).
spec() {
  cat <<YAML
name: $1
worker: {script: ddp_train.py, python: $PY, args: [--out, out, --steps, "$2", --expect-nodes, "2", --timeout, "30"$4]}
parallelism: {world_size: 4}
resources: {device_type: cpu, nodes: 2}
max_restarts: $3
YAML
}
spec mhs-ddp 6 0 "" > "$T/one.yaml"
spec mhs-restart 10 1 ', --step-sleep, "0.3"' > "$T/restart.yaml"
for n in 6 10; do
  "$PY" "$SCRIPT" --simulate-world 4 --steps "$n" --out "$T/sim$n" > /dev/null || fail "simulation"
done

MH_EMBERD_FLAGS="--allow-root-scripts" mh_cluster "$STORE" "$EMBERD" "$WORKER" "$T"
mh_wait_nodes 2

submit() {  # submit SPEC OUT: emberctl submit --follow through host 1, in the background
  timeout 80 ip netns exec "${MH}-1" env EMBER_ADDRESS="$MH_API" EMBER_TOKEN_FILE="$MH_TOKEN" \
    "$MH_EMBERCTL" submit "$1" --follow > "$2" 2>&1 &
  MH_PIDS="$MH_PIDS $!"
  FOLLOW=$!
}
show() {
  tail -30 "$1" "$T"/host*.log
  for f in "$T"/jobs/*/logs/rank-*.log; do echo "--- $f"; tail -15 "$f"; done
}
# check_losses OUT STEPS: the last attempt's loss of every step = the simulation's.
check_losses() {
  "$PY" - "$1/losses.txt" "$T/sim$2/simulated.txt" "$2" <<'EOF' || fail "losses of $1"
import sys
got = {}
for line in open(sys.argv[1]):
    attempt, step, loss, _ = line.split()
    got[int(step)] = float(loss)
ref = {int(l.split()[0]): float(l.split()[1]) for l in open(sys.argv[2])}
assert sorted(got) == list(range(int(sys.argv[3]))) == sorted(ref), (sorted(got), sorted(ref))
worst = max(abs(got[s] - ref[s]) / max(1e-12, abs(ref[s])) for s in ref)
print(f"losses: {len(ref)} steps, worst relative difference to the simulation {worst:.1e}")
assert worst <= 1e-5, worst
EOF
}
# check_envs OUT ATTEMPT: every rank's recorded environment (the script asserted the contract):
# both groups, MASTER_ADDR = the address of the host running rank 0, each rank's gloo interface
# eth0, the restart count. Prints the rank of a rank on the other host.
check_envs() {
  "$PY" - "$1" "$2" "$T" <<'EOF' || fail "environment of attempt $2"
import json, sys
out, attempt, t = sys.argv[1], int(sys.argv[2]), sys.argv[3]
envs = [json.load(open(f"{out}/env-rank-{r}-attempt-{attempt}.json")) for r in range(4)]
groups = {int(e["GROUP_RANK"]) for e in envs}
assert groups == {0, 1}, f"GROUP_RANKs {groups}: not two nodes"
masters = {e["MASTER_ADDR"] for e in envs}
assert len(masters) == 1 and masters <= {"10.77.0.2", "10.77.0.3"}, masters
for r, e in enumerate(envs):
    assert e["WORLD_SIZE"] == "4" and e["LOCAL_WORLD_SIZE"] == "2", e
    assert e["TORCHELASTIC_RESTART_COUNT"] == str(attempt), e
    assert e["GLOO_SOCKET_IFNAME"] == "eth0", f"rank {r}: GLOO_SOCKET_IFNAME {e['GLOO_SOCKET_IFNAME']}"
print(next(r for r, e in enumerate(envs) if e["GROUP_RANK"] == "1"), envs[0]["MASTER_ADDR"],
      envs[0]["MASTER_PORT"], file=open(f"{t}/other", "w"))
EOF
}
job_out() { find "$T/jobs" -maxdepth 2 -path "*/$1/out" | head -1; }

# 1. A clean run across both hosts.
submit "$T/one.yaml" "$T/one.out"
wait "$FOLLOW"
grep -q SUCCEEDED "$T/one.out" || { show "$T/one.out"; fail "the two-host script job did not succeed"; }
JOB=$(head -1 "$T/one.out" | awk '{print $1}')
STATUS=$(mh_ctl 1 --output json status "$JOB")
echo "$STATUS" | grep -q '"host1"' && echo "$STATUS" | grep -q '"host2"' \
  || fail "the job is not placed on both hosts: $STATUS"
OUT=$(job_out "$JOB")
[ -n "$OUT" ] || fail "no output directory of $JOB"
check_envs "$OUT" 0
check_losses "$OUT" 6
read -r _ MADDR MPORT < "$T/other"
echo "PASS 1: $JOB SUCCEEDED on host1+host2, MASTER_ADDR $MADDR:$MPORT, gloo on eth0"

# 2. kill -9 of a rank on the host without rank 0, mid-run: one restart across both hosts.
submit "$T/restart.yaml" "$T/restart.out"
for _ in $(seq 600); do
  JOB2=$(head -1 "$T/restart.out" 2>/dev/null | awk '{print $1}')
  OUT2=$([ -n "$JOB2" ] && job_out "$JOB2")
  [ -n "$OUT2" ] && awk '$1 == 0 && $2 >= 2 { f = 1 } END { exit !f }' "$OUT2/losses.txt" 2>/dev/null && break
  kill -0 "$FOLLOW" 2>/dev/null || { show "$T/restart.out"; fail "the job ended before step 2"; }
  sleep 0.1
done
[ -n "${OUT2:-}" ] && [ -f "$OUT2/losses.txt" ] || { show "$T/restart.out"; fail "attempt 0 never reached step 2"; }
check_envs "$OUT2" 0
read -r VICTIM _ < "$T/other"
PID=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['pid'])" "$OUT2/env-rank-$VICTIM-attempt-0.json")
kill -KILL "$PID" || fail "kill -9 of rank $VICTIM (pid $PID)"
echo "killed rank $VICTIM (pid $PID, GROUP_RANK 1) with SIGKILL"
wait "$FOLLOW"
grep -q SUCCEEDED "$T/restart.out" || { show "$T/restart.out"; fail "the restarted job did not succeed"; }
STATUS2=$(mh_ctl 1 --output json status "$JOB2")
echo "$STATUS2" | grep -q "rank $VICTIM.*signal 9" \
  || fail "attempt 0's failure does not name rank $VICTIM and signal 9: $STATUS2"
check_envs "$OUT2" 1
awk '$1 == 1 { n++; if (min == "" || $2 < min) min = $2 } END { exit !(n > 0 && min > 0) }' "$OUT2/losses.txt" \
  || fail "attempt 1 did not resume from the checkpoint: $(cat "$OUT2/losses.txt")"
check_losses "$OUT2" 10
echo "PASS 2: $JOB2 restarted once (TORCHELASTIC_RESTART_COUNT=1 on both hosts) after kill -9 of" \
  "rank $VICTIM, resumed from its checkpoint, SUCCEEDED with the simulation's losses"
