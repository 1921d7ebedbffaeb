#!/usr/bin/env bash
# //bench:script_bench: runs script_bench.py with Debian's /usr/bin/python3 (torch) and the
# emberctl and DDP script of its runfiles. Extra arguments go to script_bench.py (--json, --quick,
# --rounds N, --peer=false, --allow-missing-peers).
set -u
r="${RUNFILES_DIR:-$0.runfiles}/ember"
[ -d "$r" ] || r="$(cd "$(dirname "$0")/.." && pwd)"
exec /usr/bin/python3 "$r/bench/script_bench.py" --emberctl "$r/launcher/emberctl" \
  --script "$r/tests/script/ddp_train.py" "$@"
