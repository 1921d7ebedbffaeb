#!/usr/bin/env bash
# A private two-node Slurm cluster on this host, for tests (source this file):
#
#   . tests/slurm/slurm_cluster.sh
#   slurm_start "$DIR"        # munged, slurmctld, slurmd ember-n1 and ember-n2; exports SLURM_CONF
#   sbatch ... ; srun ...     # the client commands talk to this cluster only
#   slurm_stop "$DIR"         # every daemon it started, by PID (also: trap slurm_stop EXIT)
#
# Everything lives under DIR (the generated slurm.conf, state, logs and pid files) and a short
# /tmp/ember-slurm.* directory (a fresh munge key, munged's socket for AuthInfo=socket=..., slurmd's
# spool), removed by slurm_stop. Ports are picked free at start (the
# controller's and one per slurmd), and the cluster name is unique, so a Slurm or another test
# cluster already running on this machine is neither used nor disturbed. Daemons are stopped by the
# PIDs this file started (never by name). Needs root (slurmd runs jobs as their user) and Debian's
# slurm-wlm 22.05 + munge (deploy/install-deps.sh). Configuration as in ../shared/BUILDING.md:
# proctrack/linuxproc, task/none, select/cons_tres with CR_CPU, SlurmUser=root, several slurmd on
# one host with distinct ports (config_overrides: the node CPUs are declared, not probed).
#
# SLURM_TEST_NODES (default 2) nodes with SLURM_TEST_CPUS (default 2) CPUs each; KillWait (SIGTERM to
# SIGKILL) SLURM_TEST_KILL_WAIT seconds (default 2) so
# that scancel escalates to SIGKILL quickly. The nodes' NodeAddr is SLURM_TEST_NODE_ADDR (default
# 127.0.0.1): a multi-node script job needs a non-loopback one (Ember refuses a MASTER_ADDR on
# loopback across nodes), e.g. this host's own address (//bench:slurm_bench). SchedulerParameters is
# SLURM_TEST_SCHEDULER_PARAMETERS when set (e.g. batch_sched_delay=0: a batch job is scheduled on
# submission instead of on slurmctld's next pass, up to 3 s later).

slurm__free_ports() {  # N: N distinct free TCP ports on 127.0.0.1, one per line
  /usr/bin/python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print("\n".join(str(s.getsockname()[1]) for s in socks))
PY
}

slurm__need() {
  for b in munged slurmctld slurmd sbatch srun scontrol squeue scancel; do
    if ! command -v "$b" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$b" ]; then
      echo "slurm_cluster: $b not installed; run deploy/install-deps.sh (slurm-wlm, munge)" >&2
      return 1
    fi
  done
  if [ "$(id -u)" -ne 0 ]; then
    echo "slurm_cluster: needs root (slurmd and munged as root, as in CI)" >&2
    return 1
  fi
}

# slurm_start DIR: starts the cluster and waits until every node is idle (at most ~30 s).
slurm_start() {
  local d="$1" nodes="${SLURM_TEST_NODES:-2}" cpus="${SLURM_TEST_CPUS:-2}"
  slurm__need || return 1
  export PATH="$PATH:/usr/sbin"
  rm -rf "$d/state"  # a state from an earlier cluster (another name) stops slurmctld
  mkdir -p "$d/state" "$d/log"
  # Unix socket paths are limited to 108 bytes and a test's temp dir is longer: munged's socket
  # and slurmd's spool (slurmstepd's sockets) live in a short directory, named in $d/rundir.
  local r; r=$(mktemp -d /tmp/ember-slurm.XXXXXX) || return 1
  echo "$r" > "$d/rundir"
  mkdir -p "$r/munge" "$r/spool"
  chmod 755 "$r" "$r/munge"
  dd if=/dev/urandom of="$r/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$r/munge/munge.key"
  munged --force --socket="$r/munge/munge.socket" --key-file="$r/munge/munge.key" \
    --pid-file="$d/munged.pid" --log-file="$d/log/munged.log" \
    --seed-file="$r/munge/munged.seed" 2>>"$d/log/munged.log" || {
    echo "slurm_cluster: munged failed: $(tail -n 5 "$d/log/munged.log")" >&2; return 1; }
  local ports; ports=($(slurm__free_ports $((nodes + 1))))
  local names=() i
  for i in $(seq 1 "$nodes"); do names+=("ember-n$i"); done
  {
    echo "ClusterName=embert$$"
    echo "SlurmctldHost=$(hostname -s)(127.0.0.1)"
    echo "SlurmctldPort=${ports[0]}"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$r/munge/munge.socket"
    echo "StateSaveLocation=$d/state"
    echo "SlurmdSpoolDir=$r/spool/%n"
    echo "SlurmctldPidFile=$d/slurmctld.pid"
    echo "SlurmdPidFile=$d/slurmd-%n.pid"
    echo "SlurmctldLogFile=$d/log/slurmctld.log"
    echo "SlurmdLogFile=$d/log/slurmd-%n.log"
    echo "SlurmdParameters=config_overrides"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "SchedulerType=sched/backfill"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SwitchType=switch/none"
    echo "KillWait=${SLURM_TEST_KILL_WAIT:-2}"
    echo "InactiveLimit=0"
    echo "MinJobAge=300"
    echo "SlurmdTimeout=60"
    echo "SlurmctldTimeout=60"
    echo "MessageTimeout=10"
    [ -n "${SLURM_TEST_SCHEDULER_PARAMETERS:-}" ] && echo "SchedulerParameters=$SLURM_TEST_SCHEDULER_PARAMETERS"
    for i in $(seq 1 "$nodes"); do
      echo "NodeName=${names[$((i-1))]} NodeAddr=${SLURM_TEST_NODE_ADDR:-127.0.0.1} NodeHostname=$(hostname -s) Port=${ports[$i]} CPUs=$cpus State=UNKNOWN"
    done
    echo "PartitionName=ember Nodes=$(IFS=,; echo "${names[*]}") Default=YES MaxTime=INFINITE State=UP"
  } > "$d/slurm.conf"
  export SLURM_CONF="$d/slurm.conf"
  slurmctld -f "$d/slurm.conf" -i 2>>"$d/log/slurmctld.stderr" || {
    echo "slurm_cluster: slurmctld failed: $(tail -n 5 "$d/log/slurmctld.log" "$d/log/slurmctld.stderr")" >&2; return 1; }
  for n in "${names[@]}"; do
    slurmd -f "$d/slurm.conf" -N "$n" 2>>"$d/log/slurmd-$n.stderr" || {
      echo "slurm_cluster: slurmd $n failed: $(tail -n 5 "$d/log/slurmd-$n.log")" >&2; return 1; }
  done
  local t
  for t in $(seq 300); do
    if [ "$(sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle')" -eq "$nodes" ]; then return 0; fi
    sleep 0.1
  done
  echo "slurm_cluster: nodes not idle after 30 s: $(sinfo -N 2>&1)" >&2
  tail -n 5 "$d/log/slurmctld.log" >&2
  return 1
}

# slurm_alive PID: the process exists and is not a zombie (the daemons fork into the background,
# so whoever reaps them may not have yet).
slurm_alive() {
  local st
  st=$(sed -n 's/^[0-9]* (.*) \([A-Z]\).*/\1/p' "/proc/$1/stat" 2>/dev/null)
  [ -n "$st" ] && [ "$st" != Z ]
}

# slurm_stop DIR: cancels the cluster's jobs, then stops (by PID) the slurmd, then slurmctld, then
# munged: each group gets SIGTERM, up to 10 s, then SIGKILL. munged goes last: a slurmctld
# shutting down without it retries authentication for a long time. Then any slurmstepd of the
# cluster still running.
slurm_stop() {
  local d="$1" f p group
  [ -f "$d/slurm.conf" ] && SLURM_CONF="$d/slurm.conf" timeout 10 scancel --full -u root >/dev/null 2>&1
  for group in "$d/slurmd-*.pid" "$d/slurmctld.pid" "$d/munged.pid"; do
    local pids=()
    for f in $group; do
      [ -f "$f" ] || continue
      p=$(cat "$f" 2>/dev/null)
      [ -n "$p" ] && pids+=("$p") && kill -TERM "$p" 2>/dev/null
    done
    for p in "${pids[@]}"; do
      for _ in $(seq 100); do slurm_alive "$p" || break; sleep 0.1; done
      if slurm_alive "$p"; then
        kill -KILL "$p" 2>/dev/null
        for _ in $(seq 50); do slurm_alive "$p" || break; sleep 0.1; done
      fi
    done
  done
  # A slurmstepd (one per step) can outlive its slurmd, e.g. on a node set DOWN; it holds the
  # node's slurmd log open, which marks it as this cluster's.
  local strays
  strays=$(find /proc/[0-9]*/fd -maxdepth 1 -lname "$d/log/*" 2>/dev/null | cut -d/ -f3 | sort -u | grep -vx "$$")
  if [ -n "$strays" ]; then
    kill -TERM $strays 2>/dev/null
    for p in $strays; do
      for _ in $(seq 30); do slurm_alive "$p" || break; sleep 0.1; done
      slurm_alive "$p" && kill -KILL "$p" 2>/dev/null
    done
  fi
  if [ -f "$d/rundir" ]; then
    case "$(cat "$d/rundir")" in /tmp/ember-slurm.*) rm -rf "$(cat "$d/rundir")" ;; esac
    rm -f "$d/rundir"
  fi
  return 0
}
