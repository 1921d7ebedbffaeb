#!/usr/bin/env bash
# GPU checks, prepared here and run on a lent GPU machine (one H100/H200) with the device tool:
#   1. here:   bash tests/gpu/run.sh build     (builds the GPU test binaries into tests/gpu/bin,
#              with every shared library they need that the GPU machine lacks in tests/gpu/bin/lib,
#              then runs the ldd preflight and checks the carry set is under 64 MiB)
#   2. device: run(command="bash tests/gpu/run.sh check", carry=["tests/gpu/bin"], timeout_s=480)
# The device machine has CUDA 13 and PyTorch's nvidia-* wheels (NCCL, cuBLAS) but no Bazel, gRPC,
# Abseil, spdlog or other Debian libraries, so only binaries free of gRPC/protobuf are carried,
# with every non-glibc, non-CUDA library they load. One library path (`run.sh libpath`: the carried
# lib/, the wheels' nvidia/*/lib found through Python's site-packages, the toolkit) serves every
# step, cuda_kernels.sh included; `run.sh preflight` (ldd of everything carried under that path,
# bounded to 1 s) fails at once on an unresolved library instead of at the first step.
# `check` stays under 8 minutes: each step's timeout is cut to what is left of a 450 s budget, and
# a step with nothing left is reported as not run (and fails the check). Each step's output is
# also written to $OUT/<step>.log as it runs, so a killed run still returns it.
# docs/gpu-testing.md lists what each check shows and what has run on a GPU so far (nothing yet
# for the NCCL checks).
set -euo pipefail
cd "$(dirname "$0")/../.."
BINS="runtime/base/devices_test tests/gpu/nccl_gpu_check tests/gpu/nvml_check tests/gpu/onesided_cuda_ipc_check tests/gpu/gpt_cuda_check runtime/comm/comm_bench"
LIB=tests/gpu/bin/lib
# Libraries the device machine provides (glibc, the CUDA driver/toolkit, NCCL and cuBLAS from the
# wheels); everything else a carried binary loads is carried.
PROVIDED='/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux[^/]*)\.so|/libcu|/libnccl|/libnvidia|/libnvrtc|/libnvJit'

# One LD_LIBRARY_PATH for every step.
libpath() {
  local libs="$PWD/$LIB" py site d l
  for py in python3 /usr/bin/python3; do
    site=$("$py" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) || continue
    for d in $site; do
      for l in "$d"/nvidia/*/lib "$d"/nvidia/cu13/lib; do
        [ -d "$l" ] && case ":$libs:" in *":$l:"*) ;; *) libs="$libs:$l" ;; esac
      done
    done
    break
  done
  for l in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -d "$l" ] && libs="$libs:$l"; done
  echo "$libs"
}

# ldd of every carried executable under the one library path (ldd lists every library a binary
# loads, transitively; a carried .so no binary loads does not matter), 8 at a time, bounded to
# 1 s; prints each unresolved library and fails.
PREFLIGHT_ONE='ldd "$1" 2>&1 | awk -v f="$1" "/not found/ { print \"preflight: \" f \": \" \$1 \" => not found\" }"'
preflight() {
  local path miss rc=0
  path="$(libpath)"
  miss=$(find tests/gpu/bin -type f -perm -u+x ! -name '*.so*' -print0 |
    LD_LIBRARY_PATH="$path" timeout 1 xargs -0 -P 8 -n 1 sh -c "$PREFLIGHT_ONE" _) || rc=$?
  if [ "$rc" = 124 ]; then echo "preflight: ldd did not finish within 1 s" >&2; return 1; fi
  if [ -n "$miss" ] || [ "$rc" != 0 ]; then
    [ -n "$miss" ] && echo "$miss"
    echo "preflight: unresolved libraries (LD_LIBRARY_PATH=$path)" >&2
    return 1
  fi
  echo "preflight: every carried binary resolves its libraries (LD_LIBRARY_PATH=$path)"
}

# The device machine has none of this machine's Debian libraries, so ldd here (which finds them in
# /usr/lib) cannot show a missing one. closure: every library a carried executable resolves must
# come from the carry set itself or be one the device provides (PROVIDED); prints each other one
# and fails.
closure() {
  local path bad
  path="$(libpath)"
  bad=$(find tests/gpu/bin -type f -perm -u+x ! -name '*.so*' | while read -r f; do
      LD_LIBRARY_PATH="$path" ldd "$f" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
        case "$(readlink -f "$lib")" in "$PWD"/tests/gpu/bin/*) continue ;; esac
        echo "$lib" | grep -Eq "$PROVIDED" || echo "closure: $f loads $lib from this machine (not carried, not on the device)"
      done
    done)
  if [ -n "$bad" ]; then
    echo "$bad" | sort -u
    return 1
  fi
  echo "closure: every library a carried binary loads is carried or provided by the device (glibc, CUDA, NCCL, cuBLAS)"
}

# carry_libs BINARY: copies the libraries BINARY loads that the device machine lacks into $LIB.
carry_libs() {
  ldd "$1" | awk '$3 ~ /^\// {print $3}' | grep -Ev "$PROVIDED" | sort -u |
    while read -r lib; do cp -fL "$lib" "$LIB/"; done
}

case "${1:-}" in
  libpath) libpath ;;
  preflight) preflight ;;
  closure) closure ;;
  build)
    bazel build --jobs=2 //runtime/base:devices_test //tests/gpu:nccl_gpu_check //tests/gpu:nvml_check //tests/gpu:onesided_cuda_ipc_check //tests/gpu:gpt_cuda_check //runtime/comm:comm_bench
    bin="$(bazel info bazel-bin 2>/dev/null)"
    rm -rf tests/gpu/bin && mkdir -p "$LIB"
    for b in $BINS; do
      if ldd "$bin/$b" | grep -Eq 'grpc|protobuf'; then
        echo "run.sh: $b links gRPC/protobuf, which the device machine lacks" >&2
        exit 1
      fi
      cp -f "$bin/$b" tests/gpu/bin/
      carry_libs "$bin/$b"
    done
    bash tests/gpu/cuda_kernels.sh build
    preflight
    closure
    kib=$(du -sk tests/gpu/bin | cut -f1)
    echo "carry set: tests/gpu/bin, $((kib / 1024)) MiB"
    if [ "$kib" -ge $((64 * 1024)) ]; then
      echo "run.sh: tests/gpu/bin is $((kib / 1024)) MiB; the device tool carries at most 64 MiB" >&2
      exit 1
    fi
    echo "built tests/gpu/bin; carry it to the device"
    ;;
  check)
    logs="${OUT:-/tmp/ember-gpu-logs}"
    mkdir -p "$logs"
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1 |
      tee "$logs/nvidia-smi.log" || true
    export LD_LIBRARY_PATH="$(libpath):${LD_LIBRARY_PATH:-}"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    if ! preflight 2>&1 | tee "$logs/preflight.log"; then
      echo "run.sh check: preflight failed; nothing run" | tee -a "$logs/preflight.log"
      exit 1
    fi
    rc=0
    deadline=$((SECONDS + 450))
    # step NAME SECS CMD...: CMD under `timeout`, at most SECS and at most what the budget has
    # left; its output goes to the terminal and to $logs/NAME.log as it runs.
    step() {
      local name=$1 want=$2 left=$((deadline - SECONDS)) st
      shift 2
      if [ "$left" -lt 5 ]; then
        echo "FAIL not run (the 450 s budget of run.sh check is spent): $name" | tee "$logs/$name.log"
        return 1
      fi
      set +e
      timeout "$((want < left ? want : left))" "$@" 2>&1 | tee "$logs/$name.log"
      st=${PIPESTATUS[0]}
      set -e
      echo "step $name: exit $st" | tee -a "$logs/$name.log"
      return "$st"
    }
    # Kernel checks first: every CUDA kernel against its CPU reference.
    step cuda_kernels 200 bash tests/gpu/cuda_kernels.sh check || rc=1
    EMBER_EXPECT_GPUS=1 step devices_test 60 tests/gpu/bin/devices_test || rc=1
    step nvml_check 30 tests/gpu/bin/nvml_check || rc=1  # emberd's GPU telemetry (DCGM_FI_DEV_*)
    # World size 1 only: NCCL refuses two ranks on one GPU.
    step nccl_gpu_check 150 tests/gpu/bin/nccl_gpu_check || rc=1
    # comm_bench --backend=nccl (issue 17): all_reduce/all_gather up to 1 GiB vs D2D copy, eager
    # vs lazy creation, communicator memory. The JSON report lands in $logs (bench/results/ format).
    bench_out="$logs/comm_nccl_bench.json"
    EMBER_EXPECT_GPUS=1 step comm_bench 120 sh -c \
      'tests/gpu/bin/comm_bench --backend=nccl --json --allow-missing-peers >"$0"' "$bench_out" || rc=1
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
    step onesided_cuda_ipc_check 90 tests/gpu/bin/onesided_cuda_ipc_check || rc=1
    # The GPU training step vs the CPU model (runtime/model/gpt_cuda.h).
    EMBER_EXPECT_GPUS=1 step gpt_cuda_check 120 tests/gpu/bin/gpt_cuda_check || rc=1
    echo "run.sh check: $((SECONDS)) s, exit $rc" | tee "$logs/summary.log"
    exit $rc
    ;;
  *)
    echo "usage: $0 build|check|libpath|preflight" >&2
    exit 2
    ;;
esac
