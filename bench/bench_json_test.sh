#!/bin/sh
# Runs one benchmark in its quick mode with --json and checks that stdout is exactly one JSON object
# that follows bench/bench_schema.json (bench/validate_bench_json.py). Peers are skipped where the
# benchmark can skip them, so --allow-missing-peers accepts the targets left not measured.
#   bench_json_test.sh BINARY ARGS...
set -u
bin="$1"; shift
tmp="${TEST_TMPDIR:-/tmp}"
out="$tmp/$(basename "$bin").json"
args=""
for a in "$@"; do args="$args $(printf '%s' "$a" | sed "s|@TMP@|$tmp|g")"; done
# shellcheck disable=SC2086
"$bin" --json --allow-missing-peers --quick $args > "$out"
rc=$?
if [ $rc -ne 0 ]; then
  echo "FAIL: $bin exited $rc" >&2
  exit 1
fi
exec /usr/bin/python3 bench/validate_bench_json.py bench/bench_schema.json "$out"
