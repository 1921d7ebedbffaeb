#!/usr/bin/env bash
# Bazel entry for script_test.py (Debian's /usr/bin/python3 has torch; the python3 on PATH may not).
exec /usr/bin/python3 "$(dirname "$0")/script_test.py" "$@"
