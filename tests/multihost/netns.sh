# Several "hosts" on one machine (issue 20): sourced by the tests in this package.
#
#   mh_setup N    N+1 network namespaces: ${MH}-0 (the store) and ${MH}-1..N (the hosts), each
#                 with lo up and an eth0 (veth) on a private bridge, address 10.77.0.(i+1)/24.
#                 Names carry this shell's pid, so tests running in parallel never clash; the
#                 10.77.0.0/24 addresses exist only inside the namespaces (no route in the root
#                 namespace), so the same subnet in two tests' bridges does not clash either.
#   mh_ip I       the address of namespace I.
#   mh_exec I CMD runs CMD in namespace I.
#   mh_bg I LOG CMD...  starts CMD in namespace I in the background, output to LOG; its pid is
#                 remembered and killed by mh_cleanup.
#   mh_cleanup    kills every process started here and every process left in the namespaces,
#                 deletes the namespaces (their veths go with them) and the bridge. Idempotent.
#                 mh_setup installs it on EXIT/INT/TERM, and a watchdog sends TERM after
#                 MH_DEADLINE_S seconds (default 110) so nothing outlives a hung test.
# Skips the test (exit 0 with "SKIPPED: ...") where namespaces cannot be made: not root, no `ip`.
#   mh_qdisc      delay, loss or a rate limit on every link (tc; netem falls back to nfq_netem).
#   mh_ckpt_job, mh_partition_job, mh_ranks, mh_gone_after, mh_wait_attempt: a job to partition
#                 (or cut off from the store) and its ranks (below).
# Needs: iproute2 (ip; tc for netem), root, and no sandbox (tags = ["exclusive", "local"]);
# iptables for nfq_netem.

MH="emh$$"
MH_BR="b${MH}"
MH_N=0
MH_PIDS=""
MH_WATCHDOG=""
MH_LEASE_S=3  # every emberd's --lease-ttl-s (mh_cluster)

fail() { echo "FAIL: $*" >&2; exit 1; }

# mh_init N SUBDIR STORE_BIN EMBERD_BIN EMBERCTL_BIN WORKER_BIN CORPUS: the tests' common start:
# absolute STORE EMBERD MH_EMBERCTL WORKER; an empty work directory T=$TEST_TMPDIR/SUBDIR with the
# corpus as T/data/tiny_corpus.txt (what mh_spec names); then mh_setup N.
mh_init() {
  local n="$1" sub="$2"
  STORE=$(realpath "$3"); EMBERD=$(realpath "$4"); MH_EMBERCTL=$(realpath "$5")
  WORKER=$(realpath "$6")
  T="${TEST_TMPDIR:-$(mktemp -d)}/$sub"
  rm -rf "$T"; mkdir -p "$T/data"
  cp "$7" "$T/data/tiny_corpus.txt" || fail "corpus $7"
  mh_setup "$n"
}

mh_skip() { echo "SKIPPED: $*" >&2; exit 0; }

mh_ip() { echo "10.77.0.$(( $1 + 1 ))"; }

mh_exec() { local i="$1"; shift; ip netns exec "${MH}-$i" "$@"; }

mh_bg() {
  local i="$1" log="$2"; shift 2
  ip netns exec "${MH}-$i" "$@" > "$log" 2>&1 &
  MH_PIDS="$MH_PIDS $!"
}

mh_cleanup() {
  trap - EXIT INT TERM
  local p ns
  # The watchdog subshell first (else it goes on to TERM this shell), then its sleep (which would
  # outlive it).
  if [ -n "$MH_WATCHDOG" ]; then
    local sleeper
    sleeper=$(pgrep -P "$MH_WATCHDOG" 2>/dev/null)
    kill -KILL "$MH_WATCHDOG" 2>/dev/null
    [ -n "$sleeper" ] && kill -KILL $sleeper 2>/dev/null
  fi
  mh_netem_stop > /dev/null  # a clean stop (rules removed) before everything is killed
  for p in $MH_PIDS; do kill -KILL "$p" 2>/dev/null; done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${MH}-"); do
    # What runs in our namespaces was started by this test (the daemons' workers included).
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns delete "$ns" 2>/dev/null
  done
  # The kernel tears a namespace down asynchronously (seconds, with sockets still open): delete
  # the veths (both ends) and the bridge now rather than leave them to it.
  for p in $(ip -o link show 2>/dev/null | grep -o "v${MH}-[0-9]*"); do ip link delete "$p" 2>/dev/null; done
  ip link delete "$MH_BR" 2>/dev/null
  for p in $MH_PIDS; do wait "$p" 2>/dev/null; done
  true
}

mh_setup() {
  MH_N="$1"
  [ "$(id -u)" = 0 ] || mh_skip "network namespaces need root (uid $(id -u))"
  command -v ip >/dev/null || mh_skip "no 'ip' (iproute2) on PATH"
  trap 'mh_cleanup' EXIT
  trap 'echo "FAIL: interrupted or past the ${MH_DEADLINE_S:-110} s deadline" >&2; mh_cleanup; exit 1' INT TERM
  ( sleep "${MH_DEADLINE_S:-110}"; kill -TERM $$ ) >/dev/null 2>&1 &  # holds no caller's pipe
  MH_WATCHDOG=$!
  disown "$MH_WATCHDOG"  # no "Killed" line when mh_cleanup ends it
  ip link add "$MH_BR" type bridge 2>/dev/null || mh_skip "cannot create a bridge (ip link add type bridge)"
  ip link set "$MH_BR" up || exit 1
  local i
  for i in $(seq 0 "$MH_N"); do
    local ns="${MH}-$i" v="v${MH}-$i"
    ip netns add "$ns" 2>/dev/null || mh_skip "cannot create network namespace $ns (ip netns add)"
    ip link add "$v" type veth peer name eth0 netns "$ns" || { echo "FAIL: veth $v" >&2; exit 1; }
    ip link set "$v" master "$MH_BR" up || exit 1
    ip -n "$ns" link set lo up || exit 1
    ip -n "$ns" addr add "$(mh_ip "$i")/24" dev eth0 || exit 1
    ip -n "$ns" link set eth0 up || exit 1
  done
  # Ports forward once out of the listening state (state 3); no STP, so at once, but check.
  for _ in $(seq 50); do
    local fwd=1
    for i in $(seq 0 "$MH_N"); do
      [ "$(cat "/sys/class/net/v${MH}-$i/brport/state" 2>/dev/null)" = 3 ] || fwd=0
    done
    [ "$fwd" = 1 ] && return 0
    sleep 0.1
  done
  echo "FAIL: bridge $MH_BR ports not forwarding" >&2
  exit 1
}

# mh_qdisc KIND ARGS...: `tc qdisc add dev eth0 root KIND ARGS` in every namespace, e.g. "netem
# delay 5ms loss 1%" (each round trip crosses two eth0 egresses, so 5 ms is a 10 ms RTT) or "tbf
# rate 200mbit burst 64kb latency 50ms" (a rate limit per link). Where the kernel has no sch_netem
# (this development VM), "netem delay D loss P" (either part optional, nothing else) falls back to
# nfq_netem in every namespace: the same delay and loss in userspace through NFQUEUE, applied to
# what arrives on each eth0 instead of what leaves it (every path still crosses one: the same RTT
# and loss per path; nfq_netem.cc says why not egress). Prints one line saying which was used. Skips where tc, the qdisc or
# (for the fallback) iptables is missing. Sets MH_NETEM_DELAY_MS and MH_NETEM_LOSS (a fraction)
# for a netem qdisc; MH_NETEM_USER=1 for the fallback (mh_netem_stop reports its counts).
MH_NETEM_PIDS=""
MH_NETEM_USER=0
mh_qdisc() {
  command -v tc >/dev/null || mh_skip "no 'tc' (iproute2) on PATH"
  local i user_ok=0
  [ "$1" = netem ] && mh_netem_args "${@:2}" && user_ok=1
  for i in $(seq 0 "$MH_N"); do
    if ! ip netns exec "${MH}-$i" tc qdisc add dev eth0 root "$@" 2>"$T/qdisc.err"; then
      if [ "$1" = netem ] && [ "$i" = 0 ] && grep -qi "unknown" "$T/qdisc.err"; then
        [ "$user_ok" = 1 ] || mh_skip "no sch_netem in this kernel, and the userspace fallback" \
          "has only 'delay Nms|Nus' and 'loss N%': '$*'"
        mh_netem_user
        return
      fi
      mh_skip "tc qdisc $1 unavailable (sch_$1 module?): $(cat "$T/qdisc.err")"
    fi
  done
  echo "mh_qdisc: kernel qdisc on every eth0: $*"
}

# mh_netem_args ARGS...: netem's "delay Nms|Nus" and "loss N%" into MH_NETEM_DELAY_MS and
# MH_NETEM_LOSS; 0 for a part not given. Returns 1 on any other netem option (the fallback has
# none; the kernel's netem takes them, and then MH_NETEM_* hold what could be read).
mh_netem_args() {
  MH_NETEM_DELAY_MS=0 MH_NETEM_LOSS=0
  while [ $# -gt 0 ]; do
    case "$1 ${2:-}" in
      "delay "*ms) MH_NETEM_DELAY_MS="${2%ms}" ;;
      "delay "*us) MH_NETEM_DELAY_MS=$(awk -v u="${2%us}" 'BEGIN { print u / 1000 }') ;;
      "loss "*%) MH_NETEM_LOSS=$(awk -v p="${2%\%}" 'BEGIN { print p / 100 }') ;;
      *) return 1 ;;
    esac
    shift 2
  done
}

# nfq_netem in every namespace with MH_NETEM_DELAY_MS and MH_NETEM_LOSS, started like mh_bg (logs
# $T/nfq_netem-I.log); returns once each reports its iptables rule in place.
mh_netem_user() {
  local bin="${MH_NFQ_NETEM:-$(dirname "${BASH_SOURCE[0]}")/nfq_netem}" i
  [ -x "$bin" ] || fail "no nfq_netem at $bin (set MH_NFQ_NETEM)"
  command -v iptables >/dev/null || mh_skip "no sch_netem in this kernel and no iptables for the userspace fallback (deploy/install-deps.sh)"
  MH_NETEM_USER=1
  for i in $(seq 0 "$MH_N"); do
    ip netns exec "${MH}-$i" "$bin" --queue=7 --dev=eth0 --delay_ms="$MH_NETEM_DELAY_MS" \
      --loss="$MH_NETEM_LOSS" --seed="$((i + 1))" > "$T/nfq_netem-$i.log" 2>&1 &
    MH_NETEM_PIDS="$MH_NETEM_PIDS $!"
    MH_PIDS="$MH_PIDS $!"
  done
  for i in $(seq 0 "$MH_N"); do
    for _ in $(seq 100); do
      grep -q "ready" "$T/nfq_netem-$i.log" 2>/dev/null && break
      grep -q "failed\|bad flags\|refused\|needs root" "$T/nfq_netem-$i.log" 2>/dev/null && break
      sleep 0.05
    done
    grep -q "ready" "$T/nfq_netem-$i.log" || { cat "$T/nfq_netem-$i.log" >&2; fail "nfq_netem in ${MH}-$i did not start"; }
  done
  echo "mh_qdisc: no sch_netem in this kernel; userspace nfq_netem (NFQUEUE) on every eth0's ingress:" \
    "delay ${MH_NETEM_DELAY_MS} ms, loss ${MH_NETEM_LOSS}"
}

# mh_netem_stop: stops the nfq_netem processes (TERM: each removes its rule, releases what it
# holds and prints its counts) and prints their count lines, "ns I: nfq_netem: queue 7: N packets,
# D delayed, L dropped ...". Nothing where the kernel's netem was used. Idempotent.
mh_netem_stop() {
  local p i=0
  [ -n "$MH_NETEM_PIDS" ] || return 0
  for p in $MH_NETEM_PIDS; do kill -TERM "$p" 2>/dev/null; done
  for p in $MH_NETEM_PIDS; do
    for _ in $(seq 40); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    wait "$p" 2>/dev/null
  done
  MH_NETEM_PIDS=""
  for i in $(seq 0 "$MH_N"); do
    echo "ns $i: $(grep 'nfq_netem: queue' "$T/nfq_netem-$i.log")"
  done
}

# mh_link I up|down: the link of namespace I (its eth0) up or down: a partition of that host.
mh_link() { ip -n "${MH}-$1" link set eth0 "$2"; }

# mh_cluster STORE_BIN EMBERD_BIN WORKER_BIN DIR: after mh_setup N, ember-store in namespace 0
# (at $(mh_ip 0):29500) and an emberd "host$i" in each namespace i (API at $(mh_ip i):29400, 2 cpu
# slots, lease MH_LEASE_S = 3 s, one work root DIR/jobs for all: the shared filesystem that checkpoints
# need across hosts). Each host runs its workers through DIR/worker-host$i.sh,
# which gives them that host's identity for the comm layer: EMBER_COMM_BOOT_ID (ranks with
# different boot ids never share memory, so cross-host pairs use TCP). EMBER_COMM_HOST (the
# address a rank listens on and advertises) is set by emberd itself: the host of its --listen /
# advertise address. MH_EMBERD_FLAGS (words) are added to every emberd's flags (e.g.
# --allow-root-scripts). Sets MH_TOKEN (token file) and MH_API (host 1's API address).
mh_cluster() {
  local store="$1" emberd="$2" worker="$3" dir="$4" i
  mkdir -p "$dir"
  MH_TOKEN="$dir/token"
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$MH_TOKEN"
  chmod 600 "$MH_TOKEN"
  mh_bg 0 "$dir/store.log" "$store" --listen="$(mh_ip 0):29500" --auth-token-file="$MH_TOKEN"
  for _ in $(seq 100); do  # emberd gives up on a store that is not there at its start
    grep -q "listening on" "$dir/store.log" 2>/dev/null && break
    sleep 0.1
  done
  grep -q "listening on" "$dir/store.log" || { cat "$dir/store.log" >&2; echo "FAIL: ember-store did not start" >&2; exit 1; }
  for i in $(seq 1 "$MH_N"); do
    printf '#!/bin/sh\nexport EMBER_COMM_BOOT_ID=mh-host%s\nexec %s "$@"\n' \
      "$i" "$worker" > "$dir/worker-host$i.sh"
    chmod 755 "$dir/worker-host$i.sh"
    mh_bg "$i" "$dir/host$i.log" "$emberd" --node-name="host$i" --store="$(mh_ip 0):29500" \
      --auth-token-file="$MH_TOKEN" --work-root="$dir/jobs" \
      --worker-binary="$dir/worker-host$i.sh" --cpu-slots=2 --cuda-devices=0 --lease-ttl-s="$MH_LEASE_S" \
      --poll-s=0.05 --restart-backoff-s=0.2 --listen="$(mh_ip "$i"):29400" ${MH_EMBERD_FLAGS:-}
  done
  for i in $(seq 1 "$MH_N"); do
    for _ in $(seq 200); do
      grep -q "ready: api" "$dir/host$i.log" 2>/dev/null && break
      sleep 0.1
    done
    grep -q "ready: api" "$dir/host$i.log" || {
      cat "$dir/store.log" "$dir/host$i.log" >&2; echo "FAIL: emberd host$i did not start" >&2; exit 1; }
  done
  MH_API="$(mh_ip 1):29400"
}

# mh_ctl I ARGS...: emberctl (MH_EMBERCTL) in namespace I against host I's API.
mh_ctl() {
  local i="$1"; shift
  mh_exec "$i" env EMBER_ADDRESS="$(mh_ip "$i"):29400" EMBER_TOKEN_FILE="$MH_TOKEN" "$MH_EMBERCTL" "$@"
}

# mh_wait_nodes N: until host 1's API lists N nodes (at most 10 s).
mh_wait_nodes() {
  for _ in $(seq 100); do
    [ "$(mh_ctl 1 --output json nodes 2>/dev/null | grep -c '"name"')" -ge "$1" ] && return 0
    sleep 0.1
  done
}

# mh_job JOB PYTHON: runs PYTHON (statements) with j = job JOB's status (emberctl --output json
# status) loaded, through host 1's API: mh_job "$JOB" 'print(j["state"])'.
mh_job() {
  mh_ctl 1 --output json status "$1" 2>/dev/null \
    | python3 -c "import json,sys; j=json.load(sys.stdin); $2"
}

# mh_losses FILE: "step loss" per line of a worker's metrics/rank-N.jsonl (jobs.v1.StepMetrics in
# protobuf's JSON form: step, an int64, is a quoted string; older files have it unquoted).
mh_losses() { sed -n 's/^{"step":"\{0,1\}\([0-9]*\)"\{0,1\},"loss":\([^,]*\),.*/\1 \2/p' "$1"; }

# mh_spec NAME STEPS RESOURCES [EXTRA]: the spec of testing/harness.cc TinySpec (tiny GPT,
# deterministic, a log line per step) at world 4; RESOURCES is appended inside `resources: {...}`
# (e.g. ", nodes: 2"), EXTRA (YAML lines) at the end. The corpus is data/tiny_corpus.txt next to it.
mh_spec() {
  cat <<YAML
name: $1
model: {vocab_size: 256, context_length: 32, n_layers: 1, n_heads: 2, d_model: 32, mlp: gelu}
data: {text_path: data/tiny_corpus.txt}
optimizer: {name: adamw, lr: 0.003, schedule: cosine, warmup_steps: 4}
parallelism: {strategy: fsdp, world_size: 4}
resources: {device_type: cpu$3}
steps: $2
batch_size: 4
seed: 1
threads: 1
log_every: 1
deterministic: true
${4:-}
YAML
}

# mh_ckpt_job NAME STEPS: after mh_init N, the cluster (mh_cluster into $T), then a 2-node x 2-rank
# FSDP job NAME of STEPS steps (mh_spec; checkpoints every 25, keep 2, max_restarts 1) submitted
# through host 1 once all N hosts are listed. Sets JOB.
mh_ckpt_job() {
  mh_spec "$1" "$2" ", nodes: 2" \
    "checkpoint: {dir: checkpoints, every_steps: 25, keep_last: 2}
max_restarts: 1" > "$T/job.yaml"
  mh_cluster "$STORE" "$EMBERD" "$WORKER" "$T"
  mh_wait_nodes "$MH_N"
  JOB=$(mh_ctl 1 submit "$T/job.yaml" | awk '{print $1}')
  [ -n "$JOB" ] || fail "submit"
}

# A partition of a running job (partition_test.sh, bench/partition_bench_run.sh):
# mh_partition_job STEPS AT_STEP: after mh_init 3, mh_ckpt_job mh-part STEPS; returns once its
# progress is at AT_STEP or beyond (at most 30 s, else fails). Sets JOB, KEEP and CUT (the numbers
# of its two hosts; host 1, whose API is used, is never CUT).
mh_partition_job() {
  local placed=""
  mh_ckpt_job mh-part "$1"
  for _ in $(seq 300); do
    placed=$(mh_job "$JOB" 'a=j["attempts"][-1]; print(" ".join(sorted(n["node"] for n in a["assignment"]["nodes"])) if int(j.get("progress",{}).get("metrics",{}).get("step",0)) >= '"$2"' else "")' 2>/dev/null)
    [ -n "$placed" ] && break
    sleep 0.1
  done
  [ -n "$placed" ] || { mh_ctl 1 --output json status "$JOB"; tail "$T"/host*.log; fail "job did not reach step $2"; }
  set -- $placed
  [ $# -eq 2 ] || fail "placed on '$placed', want 2 hosts"
  KEEP=${1#host}; CUT=${2#host}
}

# mh_ranks HOST JOB ATTEMPT: the pids in namespace HOST of job JOB's attempt ATTEMPT (by their
# EMBER_JOB_ID and EMBER_ATTEMPT; zombies left out).
mh_ranks() {
  local p
  for p in $(ip netns pids "${MH}-$1" 2>/dev/null); do
    tr '\0' '\n' 2>/dev/null < "/proc/$p/environ" | grep -qx "EMBER_JOB_ID=$2" || continue
    tr '\0' '\n' 2>/dev/null < "/proc/$p/environ" | grep -qx "EMBER_ATTEMPT=$3" || continue
    [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = Z ] && continue
    echo "$p"
  done
}

# mh_gone_after HOST JOB SECONDS SINCE: prints the seconds from SINCE (date +%s.%N) until job
# JOB's attempt-0 ranks in namespace HOST are gone, polled every 50 ms; returns 1 after SECONDS.
mh_gone_after() {
  for _ in $(seq $(( $3 * 20 ))); do
    [ -z "$(mh_ranks "$1" "$2" 0)" ] && { echo "$(date +%s.%N) - $4" | bc; return 0; }
    sleep 0.05
  done
  return 1
}

# mh_wait_attempt JOB N: until job JOB is RUNNING with at least N+1 attempts (at most 30 s); prints
# the time (date +%s.%N) it was seen so, or returns 1.
mh_wait_attempt() {
  for _ in $(seq 300); do
    mh_job "$1" 'sys.exit(0 if len(j["attempts"]) >= '"$(( $2 + 1 ))"' and j["state"] == "RUNNING" else 1)' 2>/dev/null \
      && { date +%s.%N; return 0; }
    sleep 0.1
  done
  return 1
}
