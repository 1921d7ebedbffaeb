#!/usr/bin/env bash
# comm_veth_bench (issue 20): all_reduce busbw across two "hosts" (network namespaces joined by
# veth pairs and a bridge, no netem), Ember's TCP transport vs torch Gloo on the same links, same
# sizes, interleaved rounds. A wrapper around comm_bench --netns (runtime/comm/comm_bench.cc): it
# makes the namespaces (netns.sh) and removes them at the end.
#
#   sudo tests/multihost/veth_bench.sh bazel-bin/runtime/comm/comm_bench [--json] [--rounds=3]
#
# Run from the repository root (comm_bench finds runtime/comm/bench/gloo_peer.py there). Sizes
# 1-64 MiB, 2 hosts x 1 rank; target: busbw >= 2x Gloo per size. Needs root (skips otherwise).
#
# Like for like: both sides run the namespace's TCP congestion control: comm_bench runs its ranks
# with EMBER_COMM_TCP_CONGESTION=system (Ember does not set CUBIC per socket) and Gloo never sets
# one; its report names it (meta tcp_congestion_control, table notes). VETH_BENCH_CC=NAME sets it
# first in every namespace (sysctl net.ipv4.tcp_congestion_control; fails the run where the
# kernel refuses, e.g. in a container whose /proc/sys is read-only); unset, the namespaces keep
# the kernel's default. The timed loops follow one rule on both sides (comm_bench's
# --loop_seconds, passed to gloo_peer.py).
set -u
BENCH=$(realpath "$1"); shift
MH_DEADLINE_S=${MH_DEADLINE_S:-900}
VETH_BENCH_CC=${VETH_BENCH_CC:-}
source "$(dirname "$0")/netns.sh"
mh_setup 2
if [ -n "$VETH_BENCH_CC" ]; then
  for i in 1 2; do
    mh_exec "$i" sysctl -qw net.ipv4.tcp_congestion_control="$VETH_BENCH_CC" ||
      fail "cannot set net.ipv4.tcp_congestion_control=$VETH_BENCH_CC in namespace $i"
    got=$(mh_exec "$i" cat /proc/sys/net/ipv4/tcp_congestion_control)
    [ "$got" = "$VETH_BENCH_CC" ] || fail "namespace $i runs $got, not $VETH_BENCH_CC"
  done
fi
for i in 1 2; do
  echo "veth_bench: namespace $i: tcp_congestion_control $(mh_exec "$i" cat /proc/sys/net/ipv4/tcp_congestion_control) (both sides)" >&2
done
"$BENCH" --netns="${MH}-1,${MH}-2" --netns_hosts="$(mh_ip 1),$(mh_ip 2)" --ops=all_reduce \
  --min_bytes=$((1 << 20)) --max_bytes=$((64 << 20)) "$@"
