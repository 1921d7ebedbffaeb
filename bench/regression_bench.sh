#!/usr/bin/env bash
# //bench:regression_bench: runs regression_bench.py with the current tree's emberctl, ember-worker,
# pipeline_bench and examples/tiny-gpt.yaml from its runfiles (the "after" side); the script builds
# the "before" commit itself. Extra arguments go to regression_bench.py (--json, --quick,
# --rounds N, --steps N, --before COMMIT, --tree DIR, --repo DIR, --no-build).
set -u
r="${RUNFILES_DIR:-$0.runfiles}/ember"
[ -d "$r" ] || r="$(cd "$(dirname "$0")/.." && pwd)"
exec /usr/bin/python3 "$r/bench/regression_bench.py" --emberctl "$r/launcher/emberctl" \
  --worker "$r/runtime/worker/ember-worker" --pipeline-bench "$r/bench/pipeline_bench" \
  --spec "$r/examples/tiny-gpt.yaml" "$@"
