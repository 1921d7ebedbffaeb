#!/usr/bin/env bash
# The test Slurm cluster itself (slurm_cluster.sh): it starts on private ports, runs a 2-node srun
# on both nodes, leaves another cluster's config alone, and slurm_stop leaves none of its daemons.
set -uo pipefail
. "$(dirname "$0")/slurm_cluster.sh"
D="${TEST_TMPDIR:-$(mktemp -d)}/cluster"
mkdir -p "$D"
fail() { echo "FAIL: $*" >&2; slurm_stop "$D"; exit 1; }
trap 'slurm_stop "$D"' EXIT
slurm_start "$D" || fail "slurm_start"
[ "$SLURM_CONF" = "$D/slurm.conf" ] || fail "SLURM_CONF=$SLURM_CONF"
out=$(timeout 30 srun -N2 --ntasks-per-node=1 bash -c 'echo "$SLURMD_NODENAME $SLURM_NODEID"' | sort)
[ "$out" = "$(printf 'ember-n1 0\nember-n2 1')" ] || fail "srun -N2 ran on: $out"
pids=$(cat "$D"/slurmd-*.pid "$D/slurmctld.pid" "$D/munged.pid")
[ "$(echo "$pids" | wc -w)" -eq 4 ] || fail "4 daemons expected: $pids"
slurm_stop "$D"
for p in $pids; do slurm_alive "$p" && fail "daemon $p still running after slurm_stop"; done
left=$(find /proc/[0-9]*/fd -maxdepth 1 -lname "$D/log/*" 2>/dev/null | cut -d/ -f3 | sort -u)
[ -z "$left" ] || fail "processes of the cluster left after slurm_stop: $left"
trap - EXIT
echo PASS
