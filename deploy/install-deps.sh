#!/usr/bin/env bash
# Installs every Debian package Ember's build, tests, examples and benchmark peers need, then the
# torch 2.15 / transformers peers venv (deploy/peers-venv.sh, /opt/ember-peers/torch-2.15; not the
# system Python). Idempotent: when everything is present it only runs dpkg-query and checks the
# venv's stamp (well under 10 s). EMBER_SKIP_PEERS_VENV=1 skips the venv (the tests that need it
# then fail, naming deploy/peers-venv.sh).
set -euo pipefail

peers_venv() {
  if [ "${EMBER_SKIP_PEERS_VENV:-0}" = 1 ]; then return 0; fi
  if ! "$(dirname "${BASH_SOURCE[0]}")/peers-venv.sh" >/dev/null; then
    echo "install-deps: ERROR: deploy/peers-venv.sh failed (see above)" >&2
    exit 1
  fi
}

PKGS=(
  # build
  bazel-bootstrap bazel-platforms g++ pkg-config
  # libraries
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libspdlog-dev libfmt-dev catch2 libopenblas-dev libsystemd-dev libyaml-cpp-dev libzstd-dev
  libxxhash-dev libssl-dev
  # bf16 GEMMs with fp32 accumulation on CPUs with avx512_bf16/AMX-BF16 (kernels/gemm.cc)
  libdnnl-dev
  # one-sided transfers (runtime/onesided) and their benchmark peer (ucx_perftest)
  libucx-dev ucx-utils
  # benchmark peers and test tools (openssl: the TLS tests make their certificates with it);
  # python3-torch is torch 1.13 (the TCPStore 1.x wire protocol); python3-venv: peers-venv.sh
  python3-torch python3-venv procps openmpi-bin libopenmpi-dev openssl
  # etcd backend tests (runtime/store/etcd_*_test start a real etcd on loopback)
  etcd-server etcd-client
  # telemetry: emberd's HTTP server (/metrics, job pages) and the tools its tests run
  libcivetweb-dev prometheus-cpp-dev prometheus chromium
  # tokenizers (make-tokens --tokenizer=sentencepiece) and the Python client (clients/python)
  libsentencepiece-dev sentencepiece python3-grpcio python3-protobuf
  # fuzzing (tools/fuzz.sh: clang++ -fsanitize=fuzzer,address); .ci/run skips it without clang
  clang libfuzzer-14-dev make
  # tests/multihost: nfq_netem (delay and loss without sch_netem), its iptables NFQUEUE rule, ping
  iptables libnetfilter-queue-dev libmnl-dev iputils-ping
  # Slurm (emberctl run --slurm, emberctl slurm sbatch; tests/slurm start their own slurmctld,
  # slurmd and munged on private ports): controller, node daemon, client commands, and munge
  slurmctld slurmd slurm-client munge
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  peers_venv
  exit 0
fi

echo "install-deps: installing ${#missing[@]} package(s): ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: ERROR: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/ember-install-deps.log 2>&1; then
  # The package lists may be stale on a fresh machine: refresh once and retry.
  $SUDO apt-get update -q >>/tmp/ember-install-deps.log 2>&1 || true
  if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/ember-install-deps.log 2>&1; then
    echo "install-deps: ERROR: apt-get could not install: ${missing[*]}" >&2
    echo "install-deps: see /tmp/ember-install-deps.log (last lines below); check the apt sources and network/mirror access." >&2
    tail -n 15 /tmp/ember-install-deps.log >&2
    exit 1
  fi
fi
peers_venv
echo "install-deps: done" >&2
