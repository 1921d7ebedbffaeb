#!/bin/sh
# //bench:partition_bench_json_test: bench_json_test.sh for partition_bench (--quick: one
# partition, ~30 s), which needs root for its network namespaces: skips without it, as the
# tests/multihost tests do.
if [ "$(id -u)" != 0 ]; then
  echo "SKIPPED: partition_bench needs root for network namespaces (uid $(id -u))" >&2
  exit 0
fi
exec sh bench/bench_json_test.sh "$@"
