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
"$EMBERD" --listen=127.0.0.1:0 --store-listen=127.0.0.1:0 --host-store --node-name=py \
  --auth-token-file="$T/token" --work-root="$T/jobs" --worker-binary="$WORKER" --cpu-slots=2 \
  --cuda-devices=0 > "$T/emberd.log" 2>&1 &
DPID=$!
ADDR=""
for _ in $(seq 100); do
  ADDR=$(grep -o "ready: api 127.0.0.1:[0-9]*" "$T/emberd.log" | grep -o "127.0.0.1:[0-9]*")
  [ -n "$ADDR" ] && break
  sleep 0.1
done
[ -n "$ADDR" ] || { cat "$T/emberd.log"; echo "FAIL: emberd did not become ready"; exit 1; }
export PYTHONPATH="$PWD/clients/python/pkg" EMBER_ADDRESS="$ADDR" EMBER_TOKEN_FILE="$T/token"
export TEST_DIR="$T"
timeout 150 "$PY" -B -P tests/e2e/python_client_test.py
rc=$?
[ $rc -eq 0 ] || { echo "--- emberd log (tail)"; tail -30 "$T/emberd.log"; }
exit $rc
