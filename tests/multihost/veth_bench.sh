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
set -u
BENCH=$(realpath "$1"); shift
MH_DEADLINE_S=${MH_DEADLINE_S:-900}
source "$(dirname "$0")/netns.sh"
mh_setup 2
"$BENCH" --netns="${MH}-1,${MH}-2" --netns_hosts="$(mh_ip 1),$(mh_ip 2)" --ops=all_reduce \
  --min_bytes=$((1 << 20)) --max_bytes=$((64 << 20)) "$@"
