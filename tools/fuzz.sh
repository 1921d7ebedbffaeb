#!/usr/bin/env bash
# libFuzzer builds of Ember's parsers of untrusted bytes (docs/fuzzing.md), outside Bazel's gcc
# toolchain: clang++ -fsanitize=fuzzer,address against the system libraries.
#
#   tools/fuzz.sh build                 build every target into $FUZZ_OUT (default .fuzz/)
#   tools/fuzz.sh run SECONDS [T...]    build, then run each target (default all) for SECONDS on a
#                                       copy of its seed corpus (tests/fuzz/corpus/<target>/);
#                                       crashes are saved in $FUZZ_OUT/crashes/<target>/
#   tools/fuzz.sh list                  the target names
#
# Exit status: 0 when every target built and ran without a crash, 1 otherwise; the last line is
# "fuzz: N passed, N failed". Needs clang++ and libFuzzer (deploy/install-deps.sh installs clang
# and libfuzzer-14-dev); without clang it says so and exits 0 with "fuzz: skipped".
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${FUZZ_OUT:-.fuzz}"
CXX="${FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}"
TARGETS=(safetensors checkpoint_metadata spec_yaml spec_json wal fast_path tcpstore_protocol)

if [ "${1:-}" = "list" ]; then printf '%s\n' "${TARGETS[@]}"; exit 0; fi
if [ -z "$CXX" ]; then echo "fuzz: skipped (no clang++)"; exit 0; fi

# spec_yaml and spec_json share one harness binary (spec) and differ in their corpus.
harness() { case "$1" in spec_yaml|spec_json) echo spec;; *) echo "$1";; esac; }

# tools/fuzz.mk compiles each source once (shared objects, header dependencies tracked).
build() {
  mkdir -p "$OUT"
  make -s -f tools/fuzz.mk OUT="$OUT" CXX="$CXX" -j"${FUZZ_JOBS:-2}" > "$OUT/build.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then echo "fuzz: build FAILED (see $OUT/build.log)"; tail -n 30 "$OUT/build.log"; fi
  return $rc
}

if [ "${1:-}" = "build" ]; then build; exit $?; fi
if [ "${1:-}" != "run" ] || [ -z "${2:-}" ]; then sed -n 2,14p "$0"; exit 2; fi
secs="$2"; shift 2
[ $# -gt 0 ] && TARGETS=("$@")
build_ok=1
build || build_ok=0
passed=0; failed=0
for t in "${TARGETS[@]}"; do
  bin="$OUT/bin/$(harness "$t")"
  if [ ! -x "$bin" ]; then echo "fuzz: $t not built"; failed=$((failed + 1)); continue; fi
  work="$OUT/corpus/$t"; crashes="$OUT/crashes/$t"
  rm -rf "$work"; mkdir -p "$work" "$crashes"
  cp tests/fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
  dict=(); [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  log="$OUT/$t.log"
  # -timeout: one input taking over 10 s is a hang; -rss_limit_mb: over 2 GiB is a finding.
  "$bin" "$work" "${dict[@]}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -artifact_prefix="$crashes/" -print_final_stats=1 > "$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || echo 0)
  if [ $rc -eq 0 ]; then
    echo "fuzz: $t ok: ${execs:-0} executions in ${secs} s, coverage ${cov:-0} edges"
    passed=$((passed + 1))
  else
    echo "fuzz: $t FAILED (exit $rc) after ${execs:-0} executions; input saved in $crashes/"
    grep -m1 -A12 -E 'ERROR: (AddressSanitizer|libFuzzer)|==ERROR' "$log" || tail -n 20 "$log"
    failed=$((failed + 1))
  fi
done
[ $build_ok -eq 1 ] || failed=$((failed + 1))
echo "fuzz: ${passed} passed, ${failed} failed"
[ $failed -eq 0 ]
