#!/usr/bin/env bash
# Installs Ember on this node: binaries, systemd units, a config skeleton and a cluster token.
#
#   deploy/install.sh                 # build with Bazel, install, do not start anything
#   deploy/install.sh --prefix=/opt/ember --no-build
#
# Then: edit /etc/ember/emberd.yaml, copy the same /etc/ember/token to every node, and
# `systemctl enable --now emberd`. Idempotent; never overwrites an existing config or token.
set -euo pipefail
PREFIX=/usr/local
BUILD=1
DESTDIR="${DESTDIR:-}"
for a in "$@"; do
  case "$a" in
    --prefix=*) PREFIX="${a#--prefix=}" ;;
    --no-build) BUILD=0 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $a" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
if [ "$BUILD" = 1 ]; then
  deploy/install-deps.sh
  bazel build -c opt //runtime/daemon:emberd //launcher:emberctl //runtime/store:ember-store \
    //runtime/worker:ember-worker //runtime/worker:ember-worker-cuda
fi
BIN="${EMBER_BAZEL_BIN:-bazel-bin}"  # where the built binaries are
install -d "$DESTDIR$PREFIX/bin" "$DESTDIR$PREFIX/lib/ember" "$DESTDIR$PREFIX/share/doc/ember" \
  "$DESTDIR/etc/ember" "$DESTDIR/etc/systemd/system"
install -m 0755 "$BIN/runtime/daemon/emberd" "$BIN/launcher/emberctl" \
  "$BIN/runtime/store/ember-store" "$BIN/runtime/worker/ember-worker" "$DESTDIR$PREFIX/bin/"
# The GPU worker (ember-worker execs it for cuda ranks), where it was built.
if [ -x "$BIN/runtime/worker/ember-worker-cuda" ]; then
  install -m 0755 "$BIN/runtime/worker/ember-worker-cuda" "$DESTDIR$PREFIX/bin/"
fi
install -m 0644 docs/operations.md "$DESTDIR$PREFIX/share/doc/ember/"
for u in emberd.service ember-store.service; do
  sed "s|/usr/local|$PREFIX|g" "deploy/systemd/$u" > "$DESTDIR/etc/systemd/system/$u"
done
[ -e "$DESTDIR/etc/ember/emberd.yaml" ] || \
  sed "s|/usr/local|$PREFIX|g" deploy/emberd.yaml > "$DESTDIR/etc/ember/emberd.yaml"
if [ -z "$DESTDIR" ] && ! id ember >/dev/null 2>&1; then
  useradd --system --home /var/lib/ember --shell /usr/sbin/nologin ember
fi
if [ ! -e "$DESTDIR/etc/ember/token" ]; then
  (umask 027; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$DESTDIR/etc/ember/token")
  [ -z "$DESTDIR" ] && chgrp ember /etc/ember/token
fi
[ -z "$DESTDIR" ] && command -v systemctl >/dev/null && systemctl daemon-reload || true
echo "installed under $DESTDIR$PREFIX; next: edit /etc/ember/emberd.yaml, systemctl enable --now emberd"
