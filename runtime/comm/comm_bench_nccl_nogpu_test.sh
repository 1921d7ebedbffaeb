#!/usr/bin/env bash
# comm_bench --backend=nccl where Bazel runs tests. Without a usable GPU (this CI): SKIP on stderr
# and exit 0 in text mode; with --json every target is not measured (value null, peer null, met
# false) with a reason that says why ("no CUDA device (...)" or "built without NCCL ..."), never a
# figure; EMBER_EXPECT_GPUS=1 turns the missing GPU into exit 1. On a machine with a GPU the same
# run must give a number for every target instead.
set -uo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAILED: $*" >&2; exit 1; }
unset EMBER_EXPECT_GPUS

"$bin" --backend=nccl --json --allow-missing-peers --quick >"$tmp/out.json" 2>"$tmp/err.txt"
rc=$?
cat "$tmp/err.txt" >&2
[ "$rc" -eq 0 ] || fail "--json --allow-missing-peers --quick exited $rc"
/usr/bin/python3 - "$tmp/out.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
assert r["benchmark"] == "comm_nccl_bench", r["benchmark"]
t = r["targets"]
names = sorted(x["name"] for x in t)
want = ["nccl ws1 all_gather algbw 64MiB vs d2d copy", "nccl ws1 all_reduce algbw 64MiB vs d2d copy"]
assert names == want, names
why = r["meta"].get("unavailable")
if why is not None:
    assert why.startswith("no CUDA device (") or why.startswith("built without NCCL"), why
    for x in t:
        assert x["met"] is False, x
        assert x["value"] is None and x["peer"] is None and x["compared"] is None, x
        assert x["reason"] == why, x
        assert x["status"] == "not measured: " + why, x
    for tab in r["tables"]:
        assert tab["rows"] == [] and tab["notes"] == ["not measured: " + why], tab
    print("no GPU: every target not measured:", why)
else:
    for x in t:
        assert x["value"] > 0 and x["peer"] > 0, x
    print("GPU", r["meta"]["device"], [(x["name"], x["compared"]) for x in t])
PY

if grep -q '"unavailable"' "$tmp/out.json"; then
  "$bin" --backend=nccl --quick >"$tmp/text.txt" 2>"$tmp/err.txt"
  rc=$?
  [ "$rc" -eq 0 ] || fail "text mode without a GPU exited $rc, want 0"
  grep -q '^SKIP comm_bench --backend=nccl: ' "$tmp/err.txt" || fail "no SKIP line on stderr"
  grep -q 'not measured: ' "$tmp/text.txt" || fail "text report names no 'not measured' target"
  EMBER_EXPECT_GPUS=1 "$bin" --backend=nccl --quick >/dev/null 2>"$tmp/err.txt"
  rc=$?
  [ "$rc" -eq 1 ] || fail "EMBER_EXPECT_GPUS=1 without a GPU exited $rc, want 1"
  grep -q 'EMBER_EXPECT_GPUS is set, but ' "$tmp/err.txt" || fail "no EMBER_EXPECT_GPUS error"
fi
"$bin" --backend=bogus >/dev/null 2>&1
[ $? -eq 2 ] || fail "--backend=bogus did not exit 2"
echo "comm_bench_nccl_nogpu_test: OK"
