#!/usr/bin/env bash
# GPU checks, prepared here and run on a lent GPU machine (one H200) with the device tool:
#   1. here:   bash tests/gpu/run.sh build     (builds the GPU test binaries into tests/gpu/bin)
#   2. device: run(command="bash tests/gpu/run.sh check", carry=["tests/gpu/bin"], timeout_s=300)
# The device machine has CUDA and NCCL (inside Python wheels) but no Bazel or gRPC, so only
# binaries free of gRPC/protobuf are carried.
#
# Today the only GPU-facing code is device discovery (runtime/base/devices.h): CUDA kernels and the
# nccl backends are later issues. This script is where their checks go.
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
  build)
    bazel build //runtime/base:devices_test
    mkdir -p tests/gpu/bin
    cp -f "$(bazel info bazel-bin 2>/dev/null)/runtime/base/devices_test" tests/gpu/bin/
    bash tests/gpu/cuda_kernels.sh build
    echo "built tests/gpu/bin; carry it to the device"
    ;;
  check)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
    # cudart comes from the toolkit on the device machine.
    export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    EMBER_EXPECT_GPUS=1 tests/gpu/bin/devices_test
    bash tests/gpu/cuda_kernels.sh check
    ;;
  *)
    echo "usage: $0 build|check" >&2
    exit 2
    ;;
esac
