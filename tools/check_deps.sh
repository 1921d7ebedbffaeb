#!/usr/bin/env bash
# The package graph points one way (issue 14; the picture is in docs/architecture.md). Reads every
# direct dependency edge of //... (deps, data and srcs alike) with `bazel query` and fails on any
# arrow against the layer order below:
#
#   base, proto           <- bench:report (the report library every *_bench uses)
#   <- store, flight, spec/job (the daemon<->worker contract), kernels, data
#   <- kernels/cuda (the GPU ops, above the CPU references they are checked against)
#   <- comm, model, checkpoint  <- fsdp, onesided  <- pipeline (stages are FSDP-sharded parts)  <- worker, daemon  <- launcher
#   <- testing (in-process clusters, test helpers)  <- tests/*, bench
#
# An edge is allowed when it stays inside one package, goes to a strictly lower layer, or joins two
# top-layer packages (tests/*, bench). Tests (test rules) may also use //testing, which nothing else
# below it may; every //testing target must be testonly. A package missing from LAYERS fails the
# check until it is placed. Prints each violation; exit status 0 = none.
#
# It also runs tools/check_contract.sh: worker environment names and the job's store keys are
# spelled out only in runtime/job (and comm's own knobs in runtime/comm/env_knobs.h).
#
#   tools/check_deps.sh            # run by .ci/run; needs only `bazel query` (no build)
set -uo pipefail
cd "$(dirname "$0")/.."

# package (or exact label) -> layer; the longest matching entry wins. ROOT is the top-level
# package (exported files only: README.md, docs/benchmarks.md, tools/gen_benchmarks.py,
# tools/cuda_resources.sh).
LAYERS='
ROOT 5
proto 5
deploy 5
third_party 5
runtime/base 10
examples 10
//bench:report 15
runtime/store 20
runtime/flight 20
runtime/jobspec 20
runtime/job 20
kernels 20
kernels/cuda 25
runtime/data 20
runtime/comm 30
runtime/model 30
checkpoint 30
runtime/fsdp 40
runtime/pipeline 45
runtime/onesided 40
runtime/worker 50
runtime/daemon 50
launcher 60
clients/python 60
testing 70
tests 80
bench 80
'
TOP=80
TESTING=70

q() { bazel query --noimplicit_deps --keep_going "$@" 2>/dev/null; }

edges=$(q --output=graph --nograph:factored 'deps(//..., 1)') || true
if [ -z "$edges" ]; then
  echo "check_deps: bazel query returned no graph (run it by hand to see why)" >&2
  exit 2
fi
tests=$(q 'tests(//...) + attr(testonly, 1, //...)')

violations=$(
  awk -v layers="$LAYERS" -v top="$TOP" -v testing="$TESTING" -v tests="$tests" '
  function pkg(l) { sub(/^\/\//, "", l); sub(/:.*/, "", l); return l == "" ? "ROOT" : l }
  function layer(l,    p, best, bestlen, k) {
    if (l in layer_of) return layer_of[l]
    p = pkg(l); best = -1; bestlen = -1
    for (k in layer_of) {
      if (k ~ /^\/\//) continue
      if ((p == k || index(p, k "/") == 1) && length(k) > bestlen) { best = layer_of[k]; bestlen = length(k) }
    }
    return best
  }
  BEGIN {
    n = split(layers, rows, "\n")
    for (i = 1; i <= n; i++) if (split(rows[i], f, " ") == 2) layer_of[f[1]] = f[2]
    n = split(tests, t, "\n")
    for (i = 1; i <= n; i++) is_test[t[i]] = 1
  }
  /->/ {
    gsub(/"/, ""); src = $1; dst = $3
    if (src !~ /^\/\// || dst !~ /^\/\//) next  # external repositories (@system, @local_cuda)
    ps = pkg(src); pd = pkg(dst)
    if (ps == pd) next
    ls = layer(src); ld = layer(dst)
    if (ls < 0) { unplaced[ps] = 1; next }
    if (ld < 0) { unplaced[pd] = 1; next }
    if (ld < ls) next
    if (ls == top && ld == top) next
    if (ld == testing && (src in is_test)) next
    printf "%s -> %s: %s (layer %d) must not depend on %s (layer %d)\n", src, dst, ps, ls, pd, ld
  }
  END { for (p in unplaced) printf "package %s has no layer: add it to LAYERS in tools/check_deps.sh\n", p }
  ' <<<"$edges" | sort -u
)

not_testonly=$(q 'kind(rule, //testing/...) except attr(testonly, 1, //testing/...)')
for t in $not_testonly; do
  violations+=$'\n'"$t: every //testing target must be testonly = True (nothing production uses it)"
done

# The daemon<->worker contract's names have one home, runtime/job (grep only; prints its own result).
contract_ok=1
bash tools/check_contract.sh || contract_ok=0

violations=$(sed '/^$/d' <<<"$violations")
if [ -n "$violations" ]; then
  echo "$violations"
  echo "check_deps: $(wc -l <<<"$violations") violation(s) of the package order (docs/architecture.md)"
  exit 1
fi
[ "$contract_ok" = 1 ] || exit 1
echo "check_deps: OK ($(grep -c -- '->' <<<"$edges") edges checked)"
