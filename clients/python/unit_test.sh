#!/usr/bin/env bash
# Runs unit_test.py under Debian's python3 (grpcio, protobuf, yaml) with the built package.
set -eu
PY=/usr/bin/python3
if ! "$PY" -c "import grpc, google.protobuf, yaml" 2>/dev/null; then
  echo "SKIPPED: $PY lacks grpc/protobuf/yaml (bash deploy/install-deps.sh installs them)"; exit 0
fi
export PYTHONPATH="$PWD/clients/python/pkg"
exec "$PY" -B -P clients/python/unit_test.py
