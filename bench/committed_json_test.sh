#!/bin/sh
# Validates the committed benchmark runs (bench/results/*.json) and checks that docs/benchmarks.md
# is exactly what tools/gen_benchmarks.py generates from them.
set -u
n=$(ls bench/results/*.json 2>/dev/null | wc -l)
if [ "$n" -lt 8 ]; then
  echo "FAIL: expected one JSON per benchmark (8) under bench/results, found $n" >&2
  exit 1
fi
/usr/bin/python3 bench/validate_bench_json.py bench/bench_schema.json bench/results/*.json || exit 1
out="${TEST_TMPDIR:-/tmp}/benchmarks.md"
/usr/bin/python3 tools/gen_benchmarks.py --out "$out" || exit 1
if ! diff -u docs/benchmarks.md "$out" > "$out.diff"; then
  head -40 "$out.diff" >&2
  echo "FAIL: docs/benchmarks.md is not what tools/gen_benchmarks.py makes of bench/results;" \
       "run /usr/bin/python3 tools/gen_benchmarks.py" >&2
  exit 1
fi
