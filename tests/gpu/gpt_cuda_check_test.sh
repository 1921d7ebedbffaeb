#!/usr/bin/env bash
# gpt_cuda_check where Bazel runs tests:
#  1. plain: without a GPU it must say SKIP with a reason and exit 0 (with one: "0 failed");
#  2. --cpu-stand-in: the harness with a reordered CPU model in the GPU's place must pass every
#     check (its tolerances sit above fp32 reordering noise);
#  3. --cpu-stand-in=broken: a stand-in that drops its ln_f gradient must fail the gradient check.
set -uo pipefail
unset EMBER_EXPECT_GPUS
bin="$1"
fail() { echo "FAILED: $*" >&2; exit 1; }

out="$("$bin" 2>&1)"; rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "plain run exited $rc"
echo "$out" | grep -Eq '^SKIP gpt_cuda_check: .+|^gpt_cuda_check: 0 failed$' ||
  fail "plain run printed neither a SKIP line nor '0 failed'"

out="$("$bin" --cpu-stand-in 2>&1)"; rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "--cpu-stand-in exited $rc"
echo "$out" | grep -q '^FAIL' && fail "--cpu-stand-in printed a FAIL line"
[ "$(echo "$out" | grep -c '^PASS')" -eq 12 ] || fail "--cpu-stand-in: expected 12 PASS lines"
echo "$out" | grep -q '^gpt_cuda_check: 0 failed$' || fail "--cpu-stand-in: no '0 failed' line"

out="$("$bin" --cpu-stand-in=broken 2>&1)"; rc=$?
echo "$out"
[ "$rc" -eq 1 ] || fail "--cpu-stand-in=broken exited $rc, want 1"
echo "$out" | grep -q '^FAIL gpt: step-1 gradients.*worst ln_f.weight' ||
  fail "--cpu-stand-in=broken: no step-1 gradient FAIL naming ln_f.weight"
echo "gpt_cuda_check_test: OK"
