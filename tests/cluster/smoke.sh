#!/usr/bin/env bash
# Smoke test / executable reference for the flags in README.md: starts etcd,
# kube-apiserver and kube-controller-manager from the binaries built by
# build.sh on free loopback ports, checks /version, /readyz, kubectl, and that
# the controller-manager reconciles (Deployment -> ReplicaSet -> Pods, default
# ServiceAccount, namespace deletion), then stops everything.
#
#   tests/cluster/smoke.sh            # builds (or reuses) the binaries first
#   tests/cluster/smoke.sh BIN_DIR    # use binaries from BIN_DIR
#   KEEP=1 tests/cluster/smoke.sh     # keep the temp dir (certs, logs)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${1:-$("$here/build.sh")}"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpufabric-cluster.XXXXXX")"
pids=()

log() { echo "[smoke] +${SECONDS}s $*" >&2; }
cleanup() {
	local rc=$? p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if ((rc != 0)); then
		log "FAILED (rc=$rc); last log lines:"
		for f in "$work"/*.log; do
			[[ -f "$f" ]] && { echo "== $f" >&2; tail -n 20 "$f" >&2; }
		done
	fi
	if [[ "${KEEP:-0}" == 1 ]]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

free_port() { # a port nothing listens on (racy but fine for a smoke test)
	local p
	while :; do
		p=$((20000 + RANDOM % 40000))
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
	done
}

wait_for() { # <what> <timeout s> <command...>
	local what="$1" t="$2"
	shift 2
	local end=$((SECONDS + t))
	until "$@" >/dev/null 2>&1; do
		((SECONDS < end)) || { log "timed out waiting for $what"; return 1; }
		sleep 0.5
	done
}

cd "$work"

# ---- PKI (the Rust harness does the same with rcgen) ----------------------
log "generating certificates in $work"
ossl() { openssl "$@" 2>/dev/null; }
ossl req -x509 -newkey rsa:2048 -nodes -days 1 -keyout ca.key -out ca.crt -subj "/CN=gpufabric-test-ca"
sign() { # <name> <subject> [extfile]
	ossl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2"
	ossl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -out "$1.crt" ${3:+-extfile "$3"}
}
cat >serving.ext <<'EOF'
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EOF
cat >client.ext <<'EOF'
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EOF
sign apiserver "/CN=kube-apiserver" serving.ext
sign admin "/O=system:masters/CN=gpufabric-admin" client.ext
sign controller-manager "/CN=system:kube-controller-manager" client.ext
ossl genrsa -out sa.key 2048
ossl rsa -in sa.key -pubout -out sa.pub

etcd_port=$(free_port)
peer_port=$(free_port)
api_port=$(free_port)

# ---- etcd ------------------------------------------------------------------
log "starting etcd on 127.0.0.1:$etcd_port"
"$bin/etcd" \
	--name=default \
	--data-dir="$work/etcd-data" \
	--listen-client-urls="http://127.0.0.1:$etcd_port" \
	--advertise-client-urls="http://127.0.0.1:$etcd_port" \
	--listen-peer-urls="http://127.0.0.1:$peer_port" \
	--initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
	--initial-cluster="default=http://127.0.0.1:$peer_port" \
	--unsafe-no-fsync \
	--log-level=warn \
	>etcd.log 2>&1 &
pids+=($!)
wait_for etcd 30 curl -fsS "http://127.0.0.1:$etcd_port/health"

# ---- kube-apiserver --------------------------------------------------------
log "starting kube-apiserver on 127.0.0.1:$api_port"
"$bin/kube-apiserver" \
	--etcd-servers="http://127.0.0.1:$etcd_port" \
	--bind-address=127.0.0.1 \
	--advertise-address=127.0.0.1 \
	--endpoint-reconciler-type=none \
	--secure-port="$api_port" \
	--tls-cert-file="$work/apiserver.crt" \
	--tls-private-key-file="$work/apiserver.key" \
	--client-ca-file="$work/ca.crt" \
	--service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--service-account-key-file="$work/sa.pub" \
	--service-account-signing-key-file="$work/sa.key" \
	--service-cluster-ip-range=10.0.0.0/24 \
	--authorization-mode=RBAC \
	--anonymous-auth=false \
	--enable-priority-and-fairness=false \
	--v=1 \
	>apiserver.log 2>&1 &
pids+=($!)
kcurl() { curl -fsS --cacert "$work/ca.crt" --cert "$work/admin.crt" --key "$work/admin.key" "https://127.0.0.1:$api_port$1"; }
wait_for "apiserver /readyz" 120 kcurl /readyz
log "/readyz: $(kcurl /readyz)"
log "/version: $(kcurl /version | tr -d ' \n')"

# ---- kubeconfigs -----------------------------------------------------------
kubeconfig() { # <file> <user> <cert basename>
	"$bin/kubectl" --kubeconfig="$1" config set-cluster local --server="https://127.0.0.1:$api_port" --certificate-authority="$work/ca.crt" --embed-certs=true >/dev/null
	"$bin/kubectl" --kubeconfig="$1" config set-credentials "$2" --client-certificate="$work/$3.crt" --client-key="$work/$3.key" --embed-certs=true >/dev/null
	"$bin/kubectl" --kubeconfig="$1" config set-context local --cluster=local --user="$2" >/dev/null
	"$bin/kubectl" --kubeconfig="$1" config use-context local >/dev/null
}
kubeconfig admin.kubeconfig admin admin
kubeconfig controller-manager.kubeconfig controller-manager controller-manager
k() { "$bin/kubectl" --kubeconfig="$work/admin.kubeconfig" "$@"; }

# ---- kube-controller-manager -----------------------------------------------
log "starting kube-controller-manager"
"$bin/kube-controller-manager" \
	--kubeconfig="$work/controller-manager.kubeconfig" \
	--authentication-kubeconfig="$work/controller-manager.kubeconfig" \
	--authorization-kubeconfig="$work/controller-manager.kubeconfig" \
	--bind-address=127.0.0.1 \
	--secure-port=0 \
	--leader-elect=false \
	--use-service-account-credentials=true \
	--service-account-private-key-file="$work/sa.key" \
	--root-ca-file="$work/ca.crt" \
	--cluster-signing-cert-file="$work/ca.crt" \
	--cluster-signing-key-file="$work/ca.key" \
	--v=1 \
	>controller-manager.log 2>&1 &
pids+=($!)

# ---- checks ----------------------------------------------------------------
log "kubectl version: $(k version -o json | tr -d ' \n')"
k version --client | grep -q "Client Version: ${KUBE_VERSION:-v1.33}" || { log "kubectl client version wrong"; exit 1; }
kcurl /version | grep -q "\"gitVersion\": \"${KUBE_VERSION:-v1.33}" || { log "apiserver /version wrong"; exit 1; }
wait_for "default ServiceAccount (serviceaccount controller)" 60 k get serviceaccount default -n default
k create deployment smoke --image=registry.invalid/smoke:1 --replicas=2 >/dev/null
has_pods() { [[ "$(k get pods -l app=smoke -o name | wc -l)" -eq 2 ]]; }
wait_for "Deployment -> ReplicaSet -> 2 Pods (deployment/replicaset controllers)" 60 has_pods
log "pods (Pending is expected: no scheduler/kubelet): $(k get pods -l app=smoke --no-headers | tr -s ' ' | tr '\n' ';')"
k create namespace smoke-ns >/dev/null
wait_for "kube-root-ca.crt ConfigMap (root-ca-cert-publisher)" 60 k get configmap kube-root-ca.crt -n smoke-ns
k delete namespace smoke-ns --wait=false >/dev/null
gone() { ! k get namespace smoke-ns; }
wait_for "namespace deletion (namespace controller)" 90 gone
log "OK: etcd + kube-apiserver + kube-controller-manager + kubectl from $bin"
