#!/bin/sh
# Checks the committed benchmark runs behind docs/benchmarks.md (issue 30's run protocol):
# - every bench/results/NAME.json is a protocol file (bench/protocol.py): >= 3 runs, each started
#   on a quiet machine, each run's report valid against bench/bench_schema.json, and every
#   aggregate row (value, met, met_runs, informational) exactly what the median of the runs gives;
# - the single runs kept in bench/results/unverified/ still follow the schema (they are listed,
#   never counted);
# - docs/benchmarks.md and bench/results/RUNS.md are exactly what tools/gen_benchmarks.py makes.
set -u
fail=0
set -- bench/results/*.json
if [ -e "$1" ]; then
  /usr/bin/python3 bench/protocol.py check "$@" || fail=1
fi
set -- bench/results/unverified/*.json
if [ -e "$1" ]; then
  /usr/bin/python3 bench/validate_bench_json.py bench/bench_schema.json "$@" || fail=1
fi
tmp="${TEST_TMPDIR:-/tmp}"
/usr/bin/python3 tools/gen_benchmarks.py --out "$tmp/benchmarks.md" --runs-out "$tmp/RUNS.md" || exit 1
for pair in "docs/benchmarks.md:$tmp/benchmarks.md" "bench/results/RUNS.md:$tmp/RUNS.md"; do
  have="${pair%%:*}"; want="${pair#*:}"
  if ! diff -u "$have" "$want" > "$want.diff"; then
    head -40 "$want.diff" >&2
    echo "FAIL: $have is not what tools/gen_benchmarks.py makes of bench/results;" \
         "run /usr/bin/python3 tools/gen_benchmarks.py" >&2
    fail=1
  fi
done
[ "$fail" -eq 0 ] && echo "PASS: committed benchmark runs follow the protocol"
exit "$fail"
