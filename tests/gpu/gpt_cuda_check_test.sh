#!/usr/bin/env bash
# Runs gpt_cuda_check where Bazel runs tests: without a GPU it must say SKIP with a reason and exit
# 0; on a machine with a GPU it must pass ("gpt_cuda_check: 0 failed").
set -uo pipefail
unset EMBER_EXPECT_GPUS
out="$("$1" 2>&1)"
rc=$?
echo "$out"
if [ "$rc" -ne 0 ]; then echo "gpt_cuda_check exited $rc" >&2; exit 1; fi
if echo "$out" | grep -Eq '^SKIP gpt_cuda_check: .+'; then exit 0; fi
if echo "$out" | grep -q '^gpt_cuda_check: 0 failed$'; then exit 0; fi
echo "gpt_cuda_check printed neither a SKIP line nor '0 failed'" >&2
exit 1
