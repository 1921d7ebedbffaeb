#!/bin/sh
# The benchmark run protocol (issue 30): builds NAME (bench/protocol.json), runs it >= 3 times on a
# quiet machine (1-minute load below 1.0 before each run), and writes every run plus the median's
# verdict to bench/results/NAME.json. Then regenerate the docs: /usr/bin/python3 tools/gen_benchmarks.py
#   bench/run.sh NAME [--runs N] [--threshold 1.0] [--max-wait 900] [--no-build] [--out FILE]
#   (--runs 1 or 2: a smoke run to /tmp/protocol-NAME-smoke.json, never a committed result)
#   bench/run.sh --list
cd "$(dirname "$0")/.." || exit 1
if [ "${1:-}" = "--list" ]; then exec /usr/bin/python3 bench/protocol.py list; fi
exec /usr/bin/python3 bench/protocol.py run "$@"
