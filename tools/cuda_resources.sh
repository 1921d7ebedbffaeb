#!/usr/bin/env bash
# Per-kernel resources of the CUDA kernels (issue 18): registers, shared memory, stack and spills
# for every architecture, read from the ptxas -v reports that kernels/cuda/cuda.bzl writes beside
# each object (this machine's toolkit has no cuobjdump). With --check, fails when a hot kernel
# (name matching $EMBER_HOT_KERNELS, default: every kernel) spills.
#
#   tools/cuda_resources.sh                      # builds //kernels/cuda:cu, prints the table
#   tools/cuda_resources.sh --check              # ... and fails on spills
#   tools/cuda_resources.sh --check a.ptxas.txt  # given reports (the sh_test passes them)
#   tools/cuda_resources.sh --check --no-toolkit # prints a SKIP (the sh_test without CUDA)
set -euo pipefail
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
if [ "${1:-}" = "--no-toolkit" ]; then  # the sh_test in a CPU-only build
  echo "SKIP cuda_resources: CPU-only build (@local_cuda found no toolkit); no kernels to check"
  exit 0
fi
reports=("$@")
if [ ${#reports[@]} -eq 0 ]; then
  cd "$(dirname "$0")/.."
  # The target exists only when @local_cuda found a toolkit.
  if bazel query //kernels/cuda:cu_ptxas_reports >/dev/null 2>&1; then
    bazel build --jobs=2 //kernels/cuda:cu_ptxas_reports
    mapfile -t reports < <(ls "$(bazel info bazel-bin)"/kernels/cuda/cu_*.ptxas.txt)
  fi
fi
if [ ${#reports[@]} -eq 0 ]; then
  echo "SKIP cuda_resources: no ptxas reports (CPU-only build: no CUDA toolkit); nothing checked"
  exit 0
fi
hot="${EMBER_HOT_KERNELS:-.}"
demangle() { if command -v c++filt >/dev/null; then c++filt; else cat; fi; }
table=$(awk '
  /Compiling entry function/ {
    match($0, /function \x27[^\x27]+\x27/); fn = substr($0, RSTART + 10, RLENGTH - 11)
    match($0, /for \x27[^\x27]+\x27/); arch = substr($0, RSTART + 5, RLENGTH - 6)
    stack = 0; st = 0; ld = 0; next }
  /bytes stack frame/ { stack = $1; st = $5; ld = $9; next }
  /Used [0-9]+ registers/ && fn != "" {
    regs = 0; smem = 0
    for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^registers/) regs = $i; if ($(i+1) == "bytes" && $(i+2) ~ /^smem/) smem = $i }
    printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", arch, regs, smem, stack, st, ld, fn; fn = "" }
' "${reports[@]}")
if [ -z "$table" ]; then echo "cuda_resources: no kernels found in ${reports[*]}" >&2; exit 2; fi
printf "%-6s %5s %6s %6s %7s %7s  %s\n" arch regs smem stack spill_st spill_ld kernel
bad=0
while IFS=$'\t' read -r arch regs smem stack st ld fn; do
  name=$(echo "$fn" | demangle | sed -E -e "s/ember::kernels::cuda::detail::(\\(anonymous namespace\\)::)?//g" -e "s/^void //" -e "s/\\(.*$//")
  printf "%-6s %5s %6s %6s %7s %7s  %s\n" "$arch" "$regs" "$smem" "$stack" "$st" "$ld" "$name"
  if [ "$check" = 1 ] && { [ "$st" != 0 ] || [ "$ld" != 0 ]; } && echo "$name" | grep -Eq "$hot"; then
    echo "SPILL: $name on $arch spills ($st bytes stored, $ld loaded); reduce its live registers" >&2
    bad=1
  fi
done <<< "$table"
[ "$check" = 1 ] && [ "$bad" = 0 ] && echo "cuda_resources: no spills in kernels matching '$hot'"
exit $bad
