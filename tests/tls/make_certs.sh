#!/usr/bin/env bash
# Writes a throw-away PKI for TLS tests into DIR with the openssl CLI (nothing is checked in):
#   ca.crt/ca.key          the cluster CA
#   node.crt/node.key      a node (emberd, ember-store, workers): serverAuth + clientAuth,
#                          subjectAltName IP:127.0.0.1, DNS:localhost
#   client.crt/client.key  a user (emberctl): clientAuth
#   rogue-ca.crt, rogue.crt/rogue.key  a client certificate from another CA (must be refused)
# Usage: make_certs.sh DIR. EC P-256 keys; valid for 2 days.
set -euo pipefail
D="$1"
mkdir -p "$D"
command -v openssl >/dev/null || { echo "make_certs.sh: openssl not found (deploy/install-deps.sh installs it)" >&2; exit 1; }
cat > "$D/openssl.cnf" <<'CNF'
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[node]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
[client]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
CNF
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$D/$1.key" 2>/dev/null; chmod 600 "$D/$1.key"; }
ca() {  # name CN
  key "$1"
  openssl req -config "$D/openssl.cnf" -new -x509 -key "$D/$1.key" -out "$D/$1.crt" -days 2 \
    -subj "/CN=$2" -extensions ca
}
leaf() {  # name CN extensions ca
  key "$1"
  openssl req -config "$D/openssl.cnf" -new -key "$D/$1.key" -out "$D/$1.csr" -subj "/CN=$2"
  openssl x509 -req -in "$D/$1.csr" -CA "$D/$4.crt" -CAkey "$D/$4.key" -set_serial "0x$(openssl rand -hex 8)" \
    -out "$D/$1.crt" -days 2 -extfile "$D/openssl.cnf" -extensions "$3" 2>/dev/null
  rm -f "$D/$1.csr"
}
ca ca "ember test CA"
leaf node localhost node ca
leaf client ember-user client ca
ca rogue-ca "some other CA"
leaf rogue ember-rogue client rogue-ca
openssl verify -CAfile "$D/ca.crt" "$D/node.crt" "$D/client.crt" >/dev/null
