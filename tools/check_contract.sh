#!/usr/bin/env bash
# The daemon<->worker contract has one home (issue 14): worker environment variable names and the
# job's store keys are spelled out only in runtime/job (env.h, keys.h), and the comm layer's own
# knobs only in runtime/comm/env_knobs.h. Everyone else, tests included, uses those constants.
# Fails on any string literal "EMBER_..., or a key literal ("progress/, "worker_exit/, "exit/,
# "stop", "failure", fr/dump_request, /attempt/, /files/), in a *.cc or *.h outside those homes
# unless the (file, literal) pair is an exception below, with its reason. Comments are ignored.
#
#   tools/check_contract.sh     # run by tools/check_deps.sh (and so by .ci/run); grep only
set -uo pipefail
cd "$(dirname "$0")/.."

HOMES='^(runtime/job/|runtime/comm/env_knobs\.h$|third_party/)'
PATTERN='"EMBER_[A-Za-z0-9_]*|"progress/|"worker_exit/|"exit/|"stop"|"failure"|fr/dump_request|/attempt/|/files/'

# file <TAB> literal <TAB> why it is not the job contract's
EXCEPTIONS=$(cat <<'LIST'
launcher/cli.cc	"EMBER_ADDRESS	emberctl's own client settings (docs/operations.md), not the worker's
launcher/cli.cc	"EMBER_TOKEN_FILE	emberctl's own client settings, not the worker's
launcher/cli.cc	"EMBER_TLS_CA	emberctl's own client settings (same names as the worker's, read by emberctl)
launcher/cli.cc	"EMBER_TLS_CERT	emberctl's own client settings
launcher/cli.cc	"EMBER_TLS_KEY	emberctl's own client settings
launcher/emberctl.cc	"EMBER_DEBUG	emberctl's log level
launcher/cmd_weights.cc	"EMBER_STORE	emberctl's own client setting (the store for weights subscribe), not the worker's EMBER_STORE_ADDR
launcher/standalone.cc	"EMBER_WORKER	which ember-worker binary `run --standalone` starts
runtime/base/devices_test.cc	"EMBER_EXPECT_GPUS	CI tells the device test how many GPUs the host has
kernels/cuda/gpu_test_util.h	"EMBER_EXPECT_GPUS	the GPU script makes the CUDA op tests fail instead of skip without a GPU
tests/gpu/gpt_cuda_check.cc	"EMBER_EXPECT_GPUS	the GPU script makes the GPU training-step check fail instead of skip without a GPU
runtime/comm/comm_bench.cc	"EMBER_EXPECT_GPUS	the GPU script makes comm_bench --backend=nccl fail instead of skip without a GPU
deploy/peers_venv.h	"EMBER_PEERS_VENV	where deploy/peers-venv.sh put the benchmarks' PyTorch peer venv, not the worker's
deploy/peers_venv.h	"EMBER_PEER_PYTHON	the benchmarks' peer interpreter override, not the worker's
runtime/comm/comm_bench.cc	"EMBER_COMM_TCP_CONGESTION	a note's text naming the knob (comm::kEnvTcpCongestion) the ranks ran with
runtime/onesided/ucx_connection.cc	"EMBER_WORLD_SIZE	onesided sits below runtime/job: the agent reads the worker's environment for its UCX device choice
runtime/onesided/ucx_connection.cc	"EMBER_LOCAL_WORLD_SIZE	as above (one-host job: UCX on lo)
runtime/onesided/ucx_connection.cc	"EMBER_STORE_ADDR	as above (the device that reaches the store)
runtime/onesided/exposure_test.cc	"EMBER_WORLD_SIZE	the test sets the environment the agent reads (ucx_connection.cc)
runtime/onesided/exposure_test.cc	"EMBER_LOCAL_WORLD_SIZE	as above
kernels/cuda/interp/interp.cc	"EMBER_CUDA_INTERP_RACECHECK	the CUDA interpreter's shared-memory checker switch (docs/gpu-testing.md), not the worker's
kernels/gemm.cc	"EMBER_BF16_GEMM	the bf16 GEMM dispatch override for tests and benchmarks (off: the fp32 path), read by the kernels, not the worker contract
kernels/gemm_test.cc	"EMBER_BF16_GEMM	gemm_widen_test sets the override before the first GEMM and checks the reason names it
tests/e2e/job_files_test.cc	/files/	the test forges a job's upload keys in the store, as an attacker without the API would
LIST
)

hits=$(
  git ls-files --cached --others --exclude-standard -- '*.cc' '*.h' | grep -Ev "$HOMES" |
    xargs -r awk -v pat="$PATTERN" '
      # The line without its // comment (a // inside a string literal does not start one).
      function code(s,    i, c, q, out) {
        q = 0; out = ""
        for (i = 1; i <= length(s); i++) {
          c = substr(s, i, 1)
          if (q) { if (c == "\\") { out = out c substr(s, i + 1, 1); i++; continue } if (c == "\"") q = 0 }
          else if (c == "\"") q = 1
          else if (c == "/" && substr(s, i + 1, 1) == "/") break
          out = out c
        }
        return out
      }
      {
        s = code($0)
        while (match(s, pat)) {
          printf "%s\t%s\t%d\n", FILENAME, substr(s, RSTART, RLENGTH), FNR
          s = substr(s, RSTART + RLENGTH)
        }
      }'
)

violations=$(awk -F'\t' -v ex="$EXCEPTIONS" '
  BEGIN { n = split(ex, rows, "\n"); for (i = 1; i <= n; i++) { split(rows[i], f, "\t"); ok[f[1] "\t" f[2]] = 1 } }
  NF >= 3 && !(($1 "\t" $2) in ok) { printf "%s:%s: %s" "\n", $1, $3, $2 }
' <<<"$hits")

if [ -n "$violations" ]; then
  echo "$violations"
  echo "check_contract: $(wc -l <<<"$violations") literal(s) of the job contract outside runtime/job" \
       "(use job::kEnv*/job::keys:: from runtime/job, comm::kEnv* from runtime/comm/env_knobs.h, or" \
       "list the exception with its reason in tools/check_contract.sh)"
  exit 1
fi
echo "check_contract: OK ($(grep -c . <<<"$hits") listed exception(s) in use)"
