#!/usr/bin/env bash
# //bench:script_bench: runs script_bench.py (torch from deploy/peers-venv.sh --python) and the
# emberctl and DDP script of its runfiles. Extra arguments go to script_bench.py (--json, --quick,
# --rounds N, --peer=false, --allow-missing-peers).
set -u
r="${RUNFILES_DIR:-$0.runfiles}/ember"
[ -d "$r" ] || r="$(cd "$(dirname "$0")/.." && pwd)"
# The peers' interpreter: EMBER_PEER_PYTHON, else the torch 2.15 venv (deploy/peers-venv.sh),
# else Debian's python3 (torch 1.13); Ember runs the script with the same one.
py="$(bash "$r/deploy/peers-venv.sh" --python)"
if [ -z "$py" ]; then echo "script_bench: no interpreter from $r/deploy/peers-venv.sh --python" >&2; exit 1; fi
exec /usr/bin/python3 "$r/bench/script_bench.py" --emberctl "$r/launcher/emberctl" \
  --script "$r/tests/script/ddp_train.py" --python "$py" "$@"
