#!/usr/bin/env bash
# The Python client (clients/python) against a real emberd on loopback: python_client_test.py
# submits, follows, waits, cancels, and checks auth and errors; `python3 -m ember` exit codes.
# Every step bounded; the daemon is killed on any exit.
set -u
EMBERD="$1"; WORKER="$2"
PY=/usr/bin/python3
if ! "$PY" -c "import grpc, google.protobuf, yaml" 2>/dev/null; then
  echo "SKIPPED: $PY lacks grpc/protobuf/yaml (bash deploy/install-deps.sh installs them)"; exit 0
fi
T="${TEST_TMPDIR:-$(mktemp -d)}/pyclient"
mkdir -p "$T"
DPID=""
cleanup() { [ -n "$DPID" ] && kill -KILL "$DPID" 2>/dev/null; true; }
trap cleanup EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$T/token"
source tests/e2e/emberd_lib.sh
start_emberd "$T/emberd.log" "$EMBERD" --listen=127.0.0.1:0 --store-listen=127.0.0.1:0 --host-store \
  --node-name=py --auth-token-file="$T/token" --work-root="$T/jobs" --worker-binary="$WORKER" \
  --cpu-slots=2 --cuda-devices=0 || { echo "FAIL: emberd did not become ready"; exit 1; }
ADDR="$API"
export PYTHONPATH="$PWD/clients/python/pkg" EMBER_ADDRESS="$ADDR" EMBER_TOKEN_FILE="$T/token"
export TEST_DIR="$T"
timeout 150 "$PY" -B -P tests/e2e/python_client_test.py
rc=$?
[ $rc -eq 0 ] || { echo "--- emberd log (tail)"; tail -30 "$T/emberd.log"; }
exit $rc
