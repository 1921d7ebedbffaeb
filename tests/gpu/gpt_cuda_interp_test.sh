#!/usr/bin/env bash
# gpt_cuda_check --tiny on the CUDA interpreter (gpt_cuda_check_interp): GptCuda's training step,
# every kernel interpreted (races, bounds, two thread orders), against the CPU Gpt. The interpreter
# is a device, so a SKIP is a failure (EMBER_EXPECT_GPUS=1); every one of the 20 checks (5 cases x
# round-trip, step-1 gradients, per-step losses and norms, final parameters) must pass.
set -uo pipefail
bin="$1"
fail() { echo "FAILED: $*" >&2; exit 1; }

out="$(EMBER_EXPECT_GPUS=1 "$bin" --tiny 2>&1)"; rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "gpt_cuda_check_interp --tiny exited $rc"
echo "$out" | grep -q '^FAIL' && fail "a check failed"
[ "$(echo "$out" | grep -c '^PASS')" -eq 20 ] || fail "expected 20 PASS lines"
echo "$out" | grep -q '^gpt_cuda_check: 0 failed$' || fail "no '0 failed' line"
echo "gpt_cuda_interp_test: OK"
