#!/usr/bin/env bash
# //bench:partition_bench (issue 20): runs partition_bench.py with Debian's /usr/bin/python3 and
# the binaries, netns.sh and corpus of its runfiles. Extra arguments go to partition_bench.py
# (--json, --quick, --runs N). Needs root (network namespaces); ~30 s a run.
#   bazel build --jobs=2 //bench:partition_bench && bazel-bin/bench/partition_bench --json
set -u
r="${RUNFILES_DIR:-$0.runfiles}/ember"
[ -d "$r" ] || r="$(cd "$(dirname "$0")/.." && pwd)"
PARTITION_BENCH_COMMAND="bazel-bin/bench/partition_bench $*" exec /usr/bin/python3 \
  "$r/bench/partition_bench.py" --run "$r/bench/partition_bench_run.sh" \
  --netns "$r/tests/multihost/netns.sh" --store "$r/runtime/store/ember-store" \
  --emberd "$r/runtime/daemon/emberd" --emberctl "$r/launcher/emberctl" \
  --worker "$r/runtime/worker/ember-worker" --corpus "$r/examples/data/tiny_corpus.txt" "$@"
