#!/usr/bin/env bash
# The certificates of bench/gpu-e2e.sh's control plane, written into the current directory
# (as tests/cluster/smoke.sh makes them): a CA, kube-apiserver's serving certificate for
# 127.0.0.1, the admin (system:masters) and kube-controller-manager client certificates,
# and the service-account key pair. E2E_PKI_DAYS (default 2) is their lifetime.
set -euo pipefail
days=${E2E_PKI_DAYS:-2}
ossl() { openssl "$@" 2>/dev/null; }
ossl req -x509 -newkey rsa:2048 -nodes -days "$days" -keyout ca.key -out ca.crt -subj "/CN=gpufabric-e2e-ca"
cat > serving.ext <<'X'
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
X
cat > client.ext <<'X'
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
X
sign() { # <name> <subject> <extfile>
  ossl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2"
  ossl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" -out "$1.crt" -extfile "$3"
  rm -f "$1.csr"
}
sign apiserver "/CN=kube-apiserver" serving.ext
sign admin "/O=system:masters/CN=gpufabric-e2e-admin" client.ext
sign controller-manager "/CN=system:kube-controller-manager" client.ext
ossl genrsa -out sa.key 2048
ossl rsa -in sa.key -pubout -out sa.pub
rm -f serving.ext client.ext ca.srl
