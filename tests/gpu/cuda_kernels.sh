#!/usr/bin/env bash
# CUDA kernel checks (issue 18), called from tests/gpu/run.sh's build and check branches:
#   here:   bash tests/gpu/cuda_kernels.sh build   -> tests/gpu/bin/cuda/{kernels/cuda/*_test,
#                                                     _solib_k8/, lib/}
#   device: bash tests/gpu/cuda_kernels.sh check   (every op vs the CPU reference, poisoned
#           outputs, bitwise determinism over two runs; EMBER_EXPECT_GPUS=1 makes a missing GPU
#           fail instead of skip)
# The device machine has CUDA 13 but no Bazel, gRPC or Debian's libraries: the binaries must not
# need gRPC/protobuf (checked here) and bring the project's shared libraries (_solib_k8) and the
# few system libraries they use (absl, OpenBLAS for the CPU reference, libstdc++) along. cuBLAS/cudart come from the device's toolkit or its Python nvidia-* wheels.
set -euo pipefail
cd "$(dirname "$0")/../.."
TESTS="elementwise_test rows_test optim_test gemm_test lce_test attention_test moe_test rope_test"
OUT=tests/gpu/bin/cuda
case "${1:-}" in
  build)
    bazel build --jobs=2 //kernels/cuda:gpu_test_binaries
    bin="$(bazel info bazel-bin 2>/dev/null)"
    # Bazel's layout is kept (binary in kernels/cuda/, the project's shared libraries in
    # _solib_k8/, found through the binaries' $ORIGIN runpath), so the kernels' fatbin travels once.
    # Libraries outside _solib_k8 go to run.sh's one lib folder (tests/gpu/bin/lib).
    rm -rf "$OUT" && mkdir -p "$OUT/kernels/cuda" "$OUT/_solib_k8" tests/gpu/bin/lib
    for t in $TESTS; do
      cp -f "$bin/kernels/cuda/$t" "$OUT/kernels/cuda/"
      if ldd "$OUT/kernels/cuda/$t" | grep -Eq 'grpc|protobuf'; then
        echo "cuda_kernels: $t links gRPC/protobuf, which the device machine lacks" >&2
        exit 1
      fi
      ldd "$bin/kernels/cuda/$t" | awk '$3 ~ /_solib_k8/ {print $3}' |
        while read -r lib; do cp -fL "$lib" "$OUT/_solib_k8/"; done
      # Other non-system, non-CUDA shared libraries go along (glibc and the toolkit stay behind).
      ldd "$bin/kernels/cuda/$t" | awk '$3 ~ /^\// {print $3}' |
        grep -Ev '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux[^/]*)\.so|/libcu|/libnccl|/libnvidia|_solib' |
        while read -r lib; do cp -fL "$lib" tests/gpu/bin/lib/; done
    done
    du -sh "$OUT"  # OpenBLAS (the CPU reference) is most of it; the device tool carries 64 MiB
    echo "cuda_kernels: built $OUT"
    ;;
  libpath)  # run.sh's one library path (every step uses the same)
    bash tests/gpu/run.sh libpath
    ;;
  check)
    export LD_LIBRARY_PATH="$(bash tests/gpu/run.sh libpath):${LD_LIBRARY_PATH:-}"
    export EMBER_EXPECT_GPUS="${EMBER_EXPECT_GPUS:-1}"
    fail=0
    for t in $TESTS; do
      echo "== $t"
      if ! "$OUT/kernels/cuda/$t" --durations yes; then fail=1; echo "cuda_kernels: $t FAILED"; fi
    done
    [ "$fail" = 0 ] && echo "cuda_kernels: all CUDA kernel tests passed"
    exit $fail
    ;;
  *)
    echo "usage: $0 build|check|libpath" >&2
    exit 2
    ;;
esac
