#!/bin/sh
# Validates the committed benchmark runs (bench/results/*.json, the input of docs/benchmarks.md).
set -u
n=$(ls bench/results/*.json 2>/dev/null | wc -l)
if [ "$n" -lt 8 ]; then
  echo "FAIL: expected one JSON per benchmark (8) under bench/results, found $n" >&2
  exit 1
fi
exec /usr/bin/python3 bench/validate_bench_json.py bench/bench_schema.json bench/results/*.json
