#!/usr/bin/env bash
# scancel of a running `emberctl run --slurm` job (2 nodes x 2 ranks of a tiny GPT, training):
# every Ember process of the job (emberctl, both node daemons, the 4 workers) is gone within 5 s.
# KillWait is 30 s here, so Slurm's SIGKILL cannot be what ends them: Ember itself must exit on
# the SIGTERM that scancel sends.
set -uo pipefail
EMBERCTL="$(realpath "$1")"; WORKER="$(realpath "$2")"; CORPUS="$3"
HERE="$(dirname "$0")"
. "$HERE/slurm_cluster.sh"
. "$HERE/slurm_lib.sh"
T="${TEST_TMPDIR:-$(mktemp -d)}/scancel"
rm -rf "$T"; mkdir -p "$T/w"
fail() { echo "FAIL: $*" >&2; for f in "$T"/w/*.out; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done >&2; exit 1; }
trap 'slurm_stop "$T/slurm"' EXIT
export EMBER_WORKER="$WORKER"
cp "$CORPUS" "$T/w/tiny_corpus.txt"
slurm_spec tiny-cancel 4 1000000 > "$T/w/tiny.yaml"
printf '#!/bin/bash\nexec %s run --slurm --work-root %s %s\n' "$EMBERCTL" "$T/w/jobs" "$T/w/tiny.yaml" > "$T/w/job.sh"
SLURM_TEST_KILL_WAIT=30 slurm_start "$T/slurm" || fail "slurm_start"
cd "$T/w"

# Every process of the job: the workers (EMBER_JOB_ID, unique to this cluster), emberctl, srun
# and the node daemons (their command lines name this test's work root). Not SLURM_JOB_ID: another
# test's cluster on this host has a job 1 too.
ember_pids() {
  { [ -n "$JOB" ] && env_pids "EMBER_JOB_ID=$JOB"; cmd_pids "$T/w/jobs"; } | sort -u
}

id=$(sbatch --parsable -N2 --ntasks-per-node=2 -o "$T/w/run.out" job.sh) || fail "sbatch"
JOB=""
for _ in $(seq 600); do
  JOB=$(grep -o "running [^ ]*" run.out 2>/dev/null | head -1 | cut -d' ' -f2)
  if [ -n "$JOB" ] && [ "$(env_pids "EMBER_JOB_ID=$JOB" | wc -l)" -ge 4 ] &&
     [ "$(losses "jobs/$JOB/metrics/rank-0.jsonl" 2>/dev/null | wc -l)" -ge 3 ]; then
    break
  fi
  sleep 0.1
done
[ -n "$JOB" ] || fail "the job did not start"
[ "$(losses "jobs/$JOB/metrics/rank-0.jsonl" | wc -l)" -ge 3 ] || fail "not training"
before=$(ember_pids)
echo "before scancel: $(echo "$before" | wc -l) processes: $(echo $before)"
[ "$(echo "$before" | wc -l)" -ge 7 ] || fail "want emberctl, 2 daemons, 4 workers: $(for p in $before; do tr '\0' ' ' < /proc/$p/cmdline; echo; done)"

t0=$(date +%s%N)
scancel "$id" || fail "scancel"
gone=""
end=$((SECONDS + 10))
while [ $SECONDS -lt $end ]; do
  left=$(ember_pids); [ -n "${SCANCEL_DEBUG:-}" ] && [ -n "$left" ] && echo "$(( ($(date +%s%N) - t0) / 1000000 )) ms: $(ps -o pid=,stat=,comm= -p "$(echo $left | tr " " ,)" | tr "\n" ";")"
  if [ -z "$left" ]; then gone=$(( ($(date +%s%N) - t0) / 1000000 )); break; fi
  sleep 0.05
done
[ -n "$gone" ] || fail "still running 10 s after scancel: $(for p in $(ember_pids); do echo "$p: $(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null)"; done)"
echo "every process of the job gone ${gone} ms after scancel"
[ "$gone" -le 5000 ] || fail "took ${gone} ms (limit 5000)"
st=$(wait_slurm_job "$id" 30)
[ "$st" = CANCELLED ] || fail "job $id is $st (want CANCELLED)"
echo PASS
