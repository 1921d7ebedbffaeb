#!/bin/sh
# Issue 30: a benchmark whose peer is PyTorch runs it under torch 2.15 (the peers venv of
# deploy/peers-venv.sh, deploy/peers_venv.h) and never falls back to Debian's torch 1.13 behind the
# reader's back. With the venv missing (EMBER_PEERS_VENV pointing at nothing, EMBER_PEER_PYTHON
# unset), kernel_bench's PyTorch rows and comm_bench's tcp-vs-gloo rows must be not measured:
# peer null, met false, a reason naming deploy/peers-venv.sh, and the run exits 3 (--json without
# --allow-missing-peers). With EMBER_PEER_PYTHON naming an interpreter that cannot import torch,
# the reason says so. Debian's /usr/bin/python3 with torch 1.13 is installed on this machine, so a
# silent fallback would measure the peer and fail these checks.
#   peer_venv_missing_test.sh KERNEL_BENCH COMM_BENCH
set -u
kb="$1"; cb="$2"
tmp="${TEST_TMPDIR:-/tmp}"
unset EMBER_PEER_PYTHON
export EMBER_PEERS_VENV="$tmp/no-such-venv"
fail=0

check() {  # check NAME JSON RC SELECT REASON_SUBSTRING META_KEY
  /usr/bin/python3 - "$@" <<'PY' || fail=1
import json, sys
name, path, rc, select, want, meta_key = sys.argv[1:7]
d = json.load(open(path))
errs = []
if rc != "3":
    errs.append("exit status %s, want 3 (a missing peer fails a --json run)" % rc)
rows = [t for t in d["targets"] if select in t["name"]]
if not rows:
    errs.append("no target whose name contains %r" % select)
for t in rows:
    if t.get("peer") is not None or t.get("met") is not False:
        errs.append("%s: peer %r met %r, want peer null and met false" % (t["name"], t.get("peer"), t.get("met")))
    if want not in (t.get("reason") or ""):
        errs.append("%s: reason %r does not contain %r" % (t["name"], t.get("reason"), want))
if not str(d["meta"].get(meta_key, "")).startswith("none: "):
    errs.append("meta.%s = %r, want 'none: <reason>'" % (meta_key, d["meta"].get(meta_key)))
for e in errs:
    print("FAIL %s: %s" % (name, e))
if not errs:
    print("ok %s: %d rows not measured (%s)" % (name, len(rows), rows[0]["reason"][:80]))
sys.exit(1 if errs else 0)
PY
}

"$kb" --json --quick --only=step,llama > "$tmp/kb.json" 2> "$tmp/kb.err"
rc=$?
# The four PyTorch rows: train_step, rope, gqa_attention, llama_train_step (all "tokens_per_s").
check kernel_bench "$tmp/kb.json" "$rc" tokens_per_s deploy/peers-venv.sh peer

EMBER_PEER_PYTHON=/bin/false "$kb" --json --quick --only=step > "$tmp/kb2.json" 2> "$tmp/kb2.err"
rc=$?
check "kernel_bench (EMBER_PEER_PYTHON without torch)" "$tmp/kb2.json" "$rc" tokens_per_s \
  "cannot import torch" peer

"$cb" --json --quick --peers=gloo > "$tmp/cb.json" 2> "$tmp/cb.err"
rc=$?
check comm_bench "$tmp/cb.json" "$rc" "tcp vs gloo" deploy/peers-venv.sh gloo_peer

if [ $fail -ne 0 ]; then
  echo "stderr of the runs:" >&2
  tail -n 5 "$tmp/kb.err" "$tmp/kb2.err" "$tmp/cb.err" >&2
  exit 1
fi
echo PASS
