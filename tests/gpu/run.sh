#!/usr/bin/env bash
# GPU checks, prepared here and run on a lent GPU machine (one H200) with the device tool:
#   1. here:   bash tests/gpu/run.sh build     (builds the GPU test binaries into tests/gpu/bin,
#              with the shared libraries they need that the GPU machine lacks in tests/gpu/bin/lib)
#   2. device: run(command="bash tests/gpu/run.sh check", carry=["tests/gpu/bin"], timeout_s=480)
# The device machine has CUDA and NCCL (inside Python wheels) but no Bazel, gRPC, Abseil or spdlog,
# so only binaries free of gRPC/protobuf are carried, with their Abseil/spdlog/fmt libraries.
# `check` stays under 8 minutes: each step's timeout is cut to what is left of a 450 s budget, and
# a step with nothing left is reported as not run (and fails the check).
# docs/gpu-testing.md lists what each check shows and what has run on a GPU so far (nothing yet
# for the NCCL checks).
set -euo pipefail
cd "$(dirname "$0")/../.."
BINS="runtime/base/devices_test tests/gpu/nccl_gpu_check tests/gpu/nvml_check tests/gpu/onesided_cuda_ipc_check tests/gpu/gpt_cuda_check runtime/comm/comm_bench"
case "${1:-}" in
  build)
    bazel build --jobs=2 //runtime/base:devices_test //tests/gpu:nccl_gpu_check //tests/gpu:nvml_check //tests/gpu:onesided_cuda_ipc_check //tests/gpu:gpt_cuda_check //runtime/comm:comm_bench
    bin="$(bazel info bazel-bin 2>/dev/null)"
    mkdir -p tests/gpu/bin/lib
    for b in $BINS; do
      if ldd "$bin/$b" | grep -Eq 'grpc|protobuf'; then
        echo "run.sh: $b links gRPC/protobuf, which the device machine lacks" >&2
        exit 1
      fi
      cp -f "$bin/$b" tests/gpu/bin/
      # Libraries from this machine's /usr/lib that the GPU machine may not have (CUDA, NCCL and
      # glibc come from the GPU machine).
      ldd "$bin/$b" | awk '/=>/ {print $3}' |
        grep -E 'libabsl_|libspdlog|libfmt|libstdc\+\+|libgcc_s' | sort -u |
        while read -r lib; do cp -fL "$lib" tests/gpu/bin/lib/; done
    done
    bash tests/gpu/cuda_kernels.sh build
    du -sh tests/gpu/bin
    echo "built tests/gpu/bin; carry it to the device"
    ;;
  check)
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv || true
    # cudart from the toolkit; NCCL from the nvidia-nccl wheel (site-packages/nvidia/nccl/lib).
    nccl_dir="$(dirname "$(find / -name 'libnccl.so.2' -path '*nvidia*' 2>/dev/null | head -1)" 2>/dev/null || true)"
    echo "libnccl.so.2 from: ${nccl_dir:-not found}"
    export LD_LIBRARY_PATH="tests/gpu/bin/lib:${nccl_dir:+$nccl_dir:}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    rc=0
    deadline=$((SECONDS + 450))
    # bounded SECS CMD...: CMD under `timeout`, at most SECS and at most what the budget has left.
    bounded() {
      local want=$1 left=$((deadline - SECONDS))
      shift
      if [ "$left" -lt 5 ]; then
        echo "FAIL not run (the 450 s budget of run.sh check is spent): $*"
        return 1
      fi
      timeout "$((want < left ? want : left))" "$@"
    }
    EMBER_EXPECT_GPUS=1 bounded 60 tests/gpu/bin/devices_test || rc=1
    bounded 30 tests/gpu/bin/nvml_check || rc=1  # emberd's GPU telemetry (DCGM_FI_DEV_* metrics)
    # World size 1 only: NCCL refuses two ranks on one GPU.
    bounded 150 tests/gpu/bin/nccl_gpu_check || rc=1
    # comm_bench --backend=nccl (issue 17): all_reduce/all_gather up to 1 GiB vs D2D copy, eager
    # vs lazy creation, communicator memory. The JSON report lands in $OUT (bench/results/ format).
    bench_out="${OUT:-/tmp}/comm_nccl_bench.json"
    EMBER_EXPECT_GPUS=1 bounded 120 tests/gpu/bin/comm_bench --backend=nccl --json \
      --allow-missing-peers >"$bench_out" || rc=1
    [ -s "$bench_out" ] && python3 - "$bench_out" <<'PY' || rc=1  # its tables, from the JSON
import json, sys
r = json.load(open(sys.argv[1]))
for t in r["tables"]:
    print("#", t["title"]); print("  ".join(t["columns"]))
    for row in t["rows"]: print("  ".join("-" if c is None else f"{c:.4g}" if isinstance(c, float) else str(c) for c in row))
    for n in t["notes"]: print("  note:", n)
for x in r["targets"]: print("TARGET", x["name"], x["compared"], x["status"])
PY
    # Two processes on one device: CUDA IPC put/get and graph capture (runtime/onesided/cuda_ipc.h).
    bounded 90 tests/gpu/bin/onesided_cuda_ipc_check || rc=1
    bounded 200 bash tests/gpu/cuda_kernels.sh check || rc=1
    # The GPU training step vs the CPU model (runtime/model/gpt_cuda.h); OpenBLAS (its CPU side)
    # and cuBLAS come from cuda_kernels.sh's library path.
    LD_LIBRARY_PATH="$(bash tests/gpu/cuda_kernels.sh libpath):$LD_LIBRARY_PATH" EMBER_EXPECT_GPUS=1 \
      bounded 120 tests/gpu/bin/gpt_cuda_check || rc=1
    echo "run.sh check: $((SECONDS)) s, exit $rc"
    exit $rc
    ;;
  *)
    echo "usage: $0 build|check" >&2
    exit 2
    ;;
esac
