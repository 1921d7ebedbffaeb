#!/usr/bin/env bash
# Creates the Python virtual environment that holds Ember's current PyTorch peers: torch 2.15.0
# (its libuv TCPStore, torchrun, Gloo, FSDP2 on CPU) and transformers 5.x (from_pretrained on
# Ember's Hugging Face exports). The system Python is not touched: Debian's python3-torch 1.13
# under /usr/bin/python3 stays for the tests where its wire protocol is the point.
#
#   deploy/peers-venv.sh            # create or check; prints the venv's python on stdout
#   EMBER_PEERS_VENV=/path deploy/peers-venv.sh
#   deploy/peers-venv.sh --python   # installs nothing: prints the interpreter the PyTorch peers
#                                   # use: $EMBER_PEER_PYTHON if set, else the venv's python when
#                                   # the venv is complete, else Debian's /usr/bin/python3 (1.13)
#
# The same rule in C++: ember::store::bench_util::PeerPython() (runtime/store/store_bench_util.h).
#
# Location: $EMBER_PEERS_VENV, default /opt/ember-peers/torch-2.15 (tests and benchmarks look
# there, see runtime/store/store_bench_util.h PeerPython()). Idempotent: a stamp file that records
# the pinned set makes a rerun instant; a changed pin list rebuilds the venv from scratch.
#
# torch 2.15.0 from PyPI is built against CUDA 13 and does not import without its nvidia-* wheels
# (libcufile.so.0, libcusparseLt.so.0, libnvshmem_host.so.3 are not in a CPU machine's system
# libraries), and PyPI has no CPU-only build, so this installs torch with its dependencies
# (about 5 GB). Everything the peers run stays on the CPU.
set -euo pipefail

VENV="${EMBER_PEERS_VENV:-/opt/ember-peers/torch-2.15}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONSTRAINTS="$HERE/peers-venv-constraints.txt"  # exact versions of everything, dependencies included
# The top-level pins; peers-venv-constraints.txt holds the rest.
PINS=(torch==2.15.0 transformers==5.25.0 safetensors==0.8.0 numpy==2.4.6)

want="$(printf '%s\n' "${PINS[@]}"; cat "$CONSTRAINTS" 2>/dev/null || true)"
want_sum="$(printf '%s' "$want" | sha256sum | cut -d' ' -f1)"
STAMP="$VENV/.ember-peers-stamp"

ready() { [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_sum" ] && [ -x "$VENV/bin/python" ]; }

if [ "${1:-}" = "--python" ]; then
  if [ -n "${EMBER_PEER_PYTHON:-}" ]; then echo "$EMBER_PEER_PYTHON"
  elif [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then echo "$VENV/bin/python"
  else echo /usr/bin/python3; fi
  exit 0
elif [ $# -gt 0 ]; then
  echo "usage: $0 [--python]" >&2
  exit 2
fi

if ready; then
  echo "$VENV/bin/python"
  exit 0
fi

log() { echo "peers-venv: $*" >&2; }
fail() { echo "peers-venv: ERROR: $*" >&2; exit 1; }

# One build at a time (CI jobs and engineers may start this at once): wait for the other one, then
# check again whether it finished the job.
mkdir -p "$(dirname "$VENV")" || fail "cannot create $(dirname "$VENV"); run as root or set EMBER_PEERS_VENV"
exec 9>"$VENV.lock"
flock 9
if ready; then
  echo "$VENV/bin/python"
  exit 0
fi

PY=""
if /usr/bin/python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  PY=/usr/bin/python3
elif command -v python3.11 >/dev/null 2>&1 && python3.11 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  PY="$(command -v python3.11)"
else
  fail "no Python with the venv module: install python3-venv (deploy/install-deps.sh does) and rerun"
fi

start=$(date +%s)
rm -f "$STAMP"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  # A venv from older pins or an interrupted run: pip brings it to the pins (no download for what
  # already matches).
  log "updating $VENV to the pins"
else
  log "creating $VENV with $PY (torch 2.15.0 and its CUDA wheels: ~5 GB, a few minutes)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" || fail "$PY -m venv $VENV failed"
fi
PIPLOG="$(mktemp /tmp/ember-peers-venv.XXXXXX.log)"
pip_install() {
  if ! "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input --progress-bar off "$@" >>"$PIPLOG" 2>&1; then
    tail -n 20 "$PIPLOG" >&2
    fail "pip install $* failed (full log: $PIPLOG); check network access to PyPI and rerun"
  fi
}
pip_install --upgrade pip==26.3
if [ -f "$CONSTRAINTS" ]; then
  pip_install -c "$CONSTRAINTS" "${PINS[@]}"
else
  pip_install "${PINS[@]}"
fi

# The checks the peers rely on: torch imports, TCPStore (libuv) exists, a training step runs on CPU,
# transformers imports its Llama.
"$VENV/bin/python" - <<'EOF' >&2 || fail "the new venv's torch/transformers do not work (see above)"
import torch, torch.distributed as dist, transformers
from transformers import LlamaForCausalLM  # noqa: F401
assert torch.__version__.startswith("2.15."), torch.__version__
assert dist.is_available() and dist.is_gloo_available()
m = torch.nn.Linear(4, 2)
opt = torch.optim.AdamW(m.parameters())
m(torch.randn(3, 4)).square().sum().backward()
opt.step()
s = dist.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True)
s.set("k", "v")
assert s.get("k") == b"v"
print(f"peers-venv: torch {torch.__version__}, transformers {transformers.__version__}: ok", flush=True)
EOF

printf '%s' "$want_sum" >"$STAMP"
log "done in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1) at $VENV"
echo "$VENV/bin/python"
