#!/usr/bin/env bash
# //bench:slurm_bench (issue 36): runs slurm_bench.py with Debian's /usr/bin/python3 and the
# emberctl, DDP script and tests/slurm cluster helpers of its runfiles; the script runs under the
# torch 2.15 interpreter of deploy/peers-venv.sh --python on both sides. Needs root (slurmd, munged)
# and Debian's slurm-wlm + munge. Extra arguments go to slurm_bench.py (--json, --quick,
# --rounds N, --peer=false, --allow-missing-peers, --nodes 0|1|2).
#   bazel build --jobs=2 //bench:slurm_bench && bazel-bin/bench/slurm_bench
set -u
r="${RUNFILES_DIR:-$0.runfiles}/ember"
[ -d "$r" ] || r="$(cd "$(dirname "$0")/.." && pwd)"
py="$(bash "$r/deploy/peers-venv.sh" --python)"
if [ -z "$py" ]; then echo "slurm_bench: no interpreter from $r/deploy/peers-venv.sh --python" >&2; exit 1; fi
SLURM_BENCH_COMMAND="bazel-bin/bench/slurm_bench $*" exec /usr/bin/python3 "$r/bench/slurm_bench.py" \
  --emberctl "$r/launcher/emberctl" --script "$r/tests/script/ddp_train.py" \
  --slurm-lib "$r/tests/slurm" --python "$py" "$@"
