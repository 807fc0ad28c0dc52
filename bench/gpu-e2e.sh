#!/usr/bin/env bash
# The whole product on one GPU host: a local control plane (etcd, kube-apiserver,
# kube-controller-manager), the process-kubelet registering the host as one GPU node (and,
# six emulated nodes in network namespaces, sharing the GPUs when there are fewer than six),
# the operator, and FabricTests applied over the API as a user would:
#
#   1. a clean test over the host node (Cordon, confirmRetest, passesToRelease 1): Passed,
#      with the real numbers in the run's status, the node's condition and /metrics;
#   2. hardware faults the product must fail, each made on the node's side (nothing in the
#      FabricTest's spec changes), one after the other: a GPU the pod cannot see although the
#      node advertises it (hidden-gpu), and a wrong result in the silent-data-corruption
#      check (sdc, the agent's hidden test hook); each with run-now: Failed or Errored, the
#      confirmation run fails too, the node is cordoned with its Event and condition;
#   3. after each, the fault removed and run-now: Passed, the node released;
#   4. a test over six emulated nodes (node i on GPU i mod the GPU count), the last one's
#      link shaped to 2 Gbit/s: node pairs in a ring, NCCL over sockets between the
#      namespaces; the shaped node named and cordoned;
#   5. a test over the emulated nodes with a GPU of their own (up to four): the multi-node
#      DDP probe at 1, 2, 4 nodes;
#   6. a test over the six emulated nodes in three topology blocks of two (label
#      e2e.gpufabric.io/block a, b, c), the shaped node's limit taken off and only the path
#      between emu-2 and emu-3 (block b) slowed to $E2E_PATH_RATE (default 2gbit): the
#      multi-node NCCL sweep inside each block and across them; block b named slow on the run,
#      no node failed or cordoned for it.
#
# It prints one table (what was applied, what the operator decided, how long each step
# took) and leaves in $OUT: gpu-e2e.log, gpu-e2e.json (the rows and what each step read
# back), objects.json (the tests, runs, nodes and Events at the end) and logs.tar.xz
# (control plane, kubelet, operator and every pod's log).
#
#   bench/gpu-e2e.sh pack    here: build what the GPU host needs into .device/ (control
#                            plane by tests/cluster/build.sh, release builds of
#                            fabric-agent, fabric-operator, fabric-kubelet; E2E_RUST_BIN=DIR
#                            takes them from DIR instead; E2E_KUBECTL=1 adds kubectl),
#                            stripped, in two xz archives (the control plane's made once);
#                            netns-nodes.sh and iproute2's
#                            Debian packages beside it
#   bench/gpu-e2e.sh         on the GPU host, as root: the whole path (reads .device/)
#   bench/gpu-e2e.sh pack-realnode   here: .device/realnode for E2E_NODE=real (the kubelet,
#                            containerd, runc, CNI plugins, the GPU device plugin fixture, and
#                            the agent image's kit; E2E_RUST_BIN=DIR names the release binaries)
#   E2E_NODE=real bench/gpu-e2e.sh   on the GPU host: the host a real node instead (see
#                            bench/gpu-e2e-realnode.sh): steps 1-3 with the agent image under
#                            the kubelet, then two pods of half the GPUs each, each measuring
#                            its own; no emulated nodes
#   E2E_DRA=1 (with E2E_NODE=real, at pack-realnode and at the run): DRA as well: the gates
#                            in the control plane and the kubelet, the scheduler, containerd
#                            1.7 with CDI and the GPU DRA kubelet plugin fixture beside the
#                            device plugin (bench/gpu-e2e-realnode.sh); the operator asks for
#                            the host's GPUs through ResourceClaims
#   bench/gpu-e2e.sh sim     a dry run of the same script here, no GPU: the agent's sim
#                            backend, the fault and the shaped link written into the sim
#                            fleet file instead, no network namespaces (E2E_BIN=DIR: the
#                            binaries, else the packed ones; E2E_SIM_GPUS=N: the host's GPU
#                            count, 4 unless set)
#
# On a lent GPU host, one call with .device beside the repository (4 GPUs: every step; one
# GPU: every step but the probe and the real node's two pods). Where the repository and the
# pack together exceed what one call may carry, the control plane's archive can travel alone
# in a first call to the same machine (.device/gpu-e2e/cp.tar.xz, a command that only lists
# it) and the rest in the next (bin.tar.xz, manifest, cp.sums, pki, debs, netns-nodes.sh):
# an ignored file already there stays between calls to a machine still held.
# E2E_PAIR_PARTNERS=1 runs the node-pair step with one partner a node (suite.nodePairs.partners).
# E2E_CLEAN_REPEATS=N runs the clean test N times (run-now) and keeps every verdict, so that
# bench/e2e-compare.py compares medians. E2E_BUDGET (default 540 s) bounds the whole run: every wait gives up in time for the
# report to be written. E2E_KEEP=1 keeps the cluster up at the end, until Ctrl-C, and prints
# its KUBECONFIG. NVLink multicast stays off (bench/lib.sh).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=${1:-run}
PACK=$ROOT/.device/gpu-e2e
W=${E2E_WORK:-/tmp/gpu-e2e}
NS=gpufabric
HOST_NODE=gpu-host
RATE=${E2E_RATE:-2gbit}
PATH_RATE=${E2E_PATH_RATE:-2gbit}

# ---- pack (here) ------------------------------------------------------------------------
if [ "$MODE" = pack-realnode ]; then
  set -e
  . bench/gpu-e2e-realnode.sh
  realnode_pack
  exit 0
fi
if [ "$MODE" = pack ]; then
  set -e
  cp_bin=${GPUFABRIC_CLUSTER_BIN:-$(tests/cluster/build.sh)}
  rust=${E2E_RUST_BIN:-}
  if [ -z "$rust" ]; then
    cargo build --release -p gpufabric-agent -p gpufabric-operator -p gpufabric-tests \
      --bin fabric-agent --bin fabric-operator --bin fabric-kubelet
    rust=${CARGO_TARGET_DIR:-target}/release
  fi
  # The run applies crds/ from this tree: they must be what the packed operator generates (a
  # field missing from them is pruned by the API server, and the run tests the default).
  crd_check=$(mktemp -d)
  "$rust/fabric-operator" crdgen --out "$crd_check" 2>/dev/null
  if ! diff -rq "$crd_check" crds >/dev/null; then
    echo "crds/ is not what $rust/fabric-operator generates: run cargo run -p gpufabric-operator -- crdgen --out crds (and --out charts/gpufabric/crds) with the same source, then pack again" >&2
    rm -rf "$crd_check"
    exit 1
  fi
  rm -rf "$crd_check"
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$PACK"
  for b in fabric-agent fabric-operator fabric-kubelet; do
    cp "$rust/$b" "$stage/bin/"
    strip "$stage/bin/$b"
  done
  # The control plane in an archive of its own, made once for the binaries it holds: one
  # stream with a dictionary larger than kube-apiserver, so that kube-controller-manager, next
  # to it, is mostly references to it (39 MB instead of 50 with xz -9e; about 8 minutes on 2
  # cores). The Rust binaries, which change with every commit, go in a second, quick archive.
  cp_list="etcd kube-apiserver kube-controller-manager"
  [ "${E2E_KUBECTL:-0}" = 1 ] && cp_list="$cp_list kubectl"
  cp_sums=$(cd "$cp_bin" && sha256sum $cp_list)
  if [ ! -f "$PACK/cp.tar.xz" ] || [ "$(cat "$PACK/cp.sums" 2>/dev/null)" != "$cp_sums" ]; then
    mkdir "$stage/cp" "$stage/cp/bin"
    for b in $cp_list; do cp "$cp_bin/$b" "$stage/cp/bin/"; done
    (cd "$stage/cp" && ls bin/* | grep -v kube- ; echo bin/kube-apiserver bin/kube-controller-manager) |
      xargs tar -C "$stage/cp" -cf - | xz -T1 --lzma2=preset=9,dict=256MiB > "$PACK/cp.tar.xz"
    echo "$cp_sums" > "$PACK/cp.sums"
  fi
  tar -C "$stage" -cf - bin | xz -T0 -6 > "$PACK/bin.tar.xz"
  {
    # E2E_SOURCE names what E2E_RUST_BIN was built from.
    echo "source: ${E2E_SOURCE:-commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- tests/src crates || echo ' + working tree')}"
    cat "$cp_bin/../complete" 2>/dev/null | grep -E 'VERSION' || true
    (cd "$stage/bin" && sha256sum ./*)
    cat "$PACK/cp.sums"
  } > "$PACK/manifest"
  rm -rf "$stage"
  # The emulated nodes: the shared helper and its iproute2 (device hosts have none).
  shared=${E2E_SHARED:-$ROOT/../shared}
  cp "$shared/device/netns-nodes.sh" "$ROOT/.device/netns-nodes.sh"
  if ! ls "$ROOT/.device/debs/"iproute2_*.deb >/dev/null 2>&1; then
    mkdir -p "$ROOT/.device/debs"
    (cd "$ROOT/.device/debs" && apt-get download iproute2 libbpf1 libbsd0 libcap2 libdb5.3 \
      libelf1 libmnl0 libselinux1 libtirpc3 libxtables12 libmd0 libpcre2-8-0)
  fi
  # A PKI for hosts without openssl (used only there; valid 30 days).
  mkdir -p "$PACK/pki"
  (cd "$PACK/pki" && E2E_PKI_DAYS=30 bash "$ROOT/bench/gpu-e2e-pki.sh")
  cat "$PACK/manifest"
  du -sh "$PACK/cp.tar.xz" "$PACK/bin.tar.xz" "$ROOT/.device"
  exit 0
fi

SIM=0
[ "$MODE" = sim ] && SIM=1
OUT=${OUT:-$ROOT/gpu-e2e-out}
mkdir -p "$OUT" "$W/logs"
# tee ignores Ctrl-C, so that what the clean-up prints still reaches the log.
exec > >(trap '' INT TERM; exec tee -a "$OUT/gpu-e2e.log") 2>&1
T0=$(date +%s)
BUDGET=${E2E_BUDGET:-540}
banner() { echo; echo "=== $* (+$(( $(date +%s) - T0 )) s, $(date -u +%H:%M:%S))"; }
. bench/lib.sh
PIDS=()

finish() {
  trap '' PIPE INT TERM
  banner "collecting"
  python3 - "$OUT/objects.json" <<'PY' || true
import json, os, sys, requests
pki = os.environ["E2E_PKI"]
tls = {"verify": f"{pki}/ca.crt", "cert": (f"{pki}/admin.crt", f"{pki}/admin.key")}
api = os.environ["E2E_API"]
out = {}
for key, path in [("fabrictests", "/apis/gpufabric.io/v1alpha1/fabrictests"),
                  ("fabrictestruns", "/apis/gpufabric.io/v1alpha1/fabrictestruns"),
                  ("fabrictestrunshards", "/apis/gpufabric.io/v1alpha1/fabrictestrunshards"),
                  ("nodes", "/api/v1/nodes"),
                  ("events", "/apis/events.k8s.io/v1/events"),
                  ("pods", f"/api/v1/namespaces/gpufabric/pods")]:
    try:
        r = requests.get(api + path, timeout=20, **tls)
        items = r.json().get("items", [])
        for i in items:
            i.get("metadata", {}).pop("managedFields", None)
        out[key] = items
    except Exception as e:
        out[key] = f"unreadable: {e}"
json.dump(out, open(sys.argv[1], "w"), indent=1)
PY
  curl -s "$E2E_METRICS" > "$W/logs/operator-metrics.txt" 2>/dev/null ||
    python3 -c "import requests,sys; print(requests.get(sys.argv[1], timeout=10).text)" "$E2E_METRICS" \
      > "$W/logs/operator-metrics.txt" 2>/dev/null || true
  local p
  for ((p = ${#PIDS[@]} - 1; p >= 0; p--)); do kill "${PIDS[$p]}" 2>/dev/null; done
  sleep 1
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  [ $SIM = 0 ] && [ -n "${NETNS:-}" ] && $NETNS down >/dev/null 2>&1
  if [ "${REAL:-0}" = 1 ]; then
    # The containers' shims outlive containerd; their logs go with the others.
    pkill -f containerd-shim-runc-v2 2>/dev/null
    cp -r "$W/realnode/pod-logs" "$W/logs/pod-logs" 2>/dev/null
  fi
  (cd "$W" && tar -cf - logs pods 2>/dev/null | xz -T0 > "$OUT/logs.tar.xz") || true
  [ $SIM = 0 ] && nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader
  banner "done"
}

# ---- binaries ---------------------------------------------------------------------------
banner "binaries"
if [ -n "${E2E_BIN:-}" ]; then
  BIN=$E2E_BIN
else
  BIN=$W/bin
  # A warm machine keeps what an earlier call unpacked.
  if ! cmp -s "$PACK/manifest" "$W/manifest"; then
    rm -rf "$BIN"
    for a in cp.tar.xz bin.tar.xz; do
      xz -dc -T0 "$PACK/$a" | tar -C "$W" -xf - || { echo "cannot unpack $PACK/$a: run bench/gpu-e2e.sh pack first"; exit 1; }
    done
    cp "$PACK/manifest" "$W/manifest"
  fi
  head -1 "$PACK/manifest"
fi
"$BIN/fabric-agent" --version

# ---- the machine ------------------------------------------------------------------------
banner "machine"
if [ $SIM = 0 ]; then
  wheel_libs
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv,noheader
  G=$(nvidia-smi -L | wc -l)
  PRODUCT=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | sed 's/^ *//; s/ *$//; s/ /-/g')
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())' 2>/dev/null
  nvidia-smi topo -m 2>/dev/null | head -8
else
  G=${E2E_SIM_GPUS:-4}
  PRODUCT=NVIDIA-H100-80GB-HBM3
fi
# Emulated nodes: six, node i on GPU i mod G; the last one's link is shaped. The pair rules
# compare each pair with the median of the run's pairs, so the shaped node's slow pairs (two
# in the ring, one retest) must stay under half of them: with four nodes they are three of
# five (the median itself: nobody is named), with five nodes the ring adds a pair and they
# are four of seven, with six three of seven. The probe runs over the nodes with a GPU of
# their own (label e2e.gpufabric.io/own-gpu), at most four: it needs two GPUs or more. On a
# one-GPU host the six share the GPU (the pairs' bandwidth is the sockets', not the GPU's;
# the node checks go one at a time), so the node-pair step runs on any GPU host.
N=6
# E2E_NODE=real: the host is a real node (containerd, runc, the kubelet, a GPU device plugin,
# the agent image; bench/gpu-e2e-realnode.sh), without emulated nodes. E2E_EMULATED_NODES=0:
# no emulated nodes with the process-kubelet either.
REAL=0
# E2E_DRA=1: the DRA gates and API versions (Kubernetes 1.33: beta and alpha, off by default).
DRA_GATES=() DRA_API=()
if [ "${E2E_DRA:-0}" = 1 ]; then
  [ "${E2E_NODE:-process}" = real ] || { echo "E2E_DRA=1 needs E2E_NODE=real"; exit 1; }
  DRA_GATES=(--feature-gates=DynamicResourceAllocation=true,DRADeviceTaints=true)
  DRA_API=(--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1alpha3=true)
fi
if [ "${E2E_NODE:-process}" = real ]; then
  REAL=1 N=0
  . bench/gpu-e2e-realnode.sh
fi
[ "${E2E_EMULATED_NODES:-6}" = 0 ] && N=0
SHAPED_I=$((N - 1))
OWN=$((G < 4 ? G : 4))
EMULATED=""
for i in $(seq 0 $((N - 1))); do EMULATED="$EMULATED${EMULATED:+,}emu-$i"; done
echo "host node $HOST_NODE: $G x $PRODUCT (nvidia.com/gpu.product, as GPU feature discovery writes it)"
echo "emulated nodes: ${EMULATED:-none} (one network namespace each; node i on GPU i mod $G)"

# ---- control plane ----------------------------------------------------------------------
banner "control plane"
PKI=$W/pki
rm -rf "$PKI" "$W/etcd-data"
mkdir -p "$PKI"
if command -v openssl >/dev/null; then
  (cd "$PKI" && bash "$ROOT/bench/gpu-e2e-pki.sh") || exit 1
else
  echo "no openssl here: the packed PKI"
  cp "$PACK/pki/"* "$PKI/"
fi
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
ETCD_PORT=$(free_port); PEER_PORT=$(free_port); API_PORT=$(free_port); OP_PORT=$(free_port)
export E2E_API=https://127.0.0.1:$API_PORT E2E_PKI=$PKI E2E_METRICS=http://127.0.0.1:$OP_PORT/metrics
kubeconfig() { # <file> <cert basename>
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: $E2E_API
    certificate-authority-data: $(base64 -w0 < "$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 < "$PKI/$2.crt")
    client-key-data: $(base64 -w0 < "$PKI/$2.key")
contexts:
- name: local
  context: {cluster: local, user: $2}
current-context: local
EOF
}
kubeconfig "$W/admin.kubeconfig" admin
kubeconfig "$W/controller-manager.kubeconfig" controller-manager
api_ready() {
  python3 - <<'PY'
import os, sys, time, requests
p = os.environ["E2E_PKI"]
end = time.time() + 90
while time.time() < end:
    try:
        r = requests.get(os.environ["E2E_API"] + "/readyz", verify=f"{p}/ca.crt",
                         cert=(f"{p}/admin.crt", f"{p}/admin.key"), timeout=5)
        if r.status_code == 200:
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.3)
sys.exit(1)
PY
}
t=$(date +%s.%N)
"$BIN/etcd" --name=default --data-dir="$W/etcd-data" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$PEER_PORT" \
  --initial-cluster="default=http://127.0.0.1:$PEER_PORT" --unsafe-no-fsync --log-level=warn \
  > "$W/logs/etcd.log" 2>&1 &
PIDS+=($!)
"$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
  --secure-port="$API_PORT" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-cluster-ip-range=10.0.0.0/24 --authorization-mode=RBAC --anonymous-auth=false \
  --enable-priority-and-fairness=false --kubelet-preferred-address-types=InternalIP \
  "${DRA_GATES[@]}" "${DRA_API[@]}" --v=1 > "$W/logs/kube-apiserver.log" 2>&1 &
PIDS+=($!)
trap finish EXIT
if ! api_ready; then
  echo "kube-apiserver not ready in 90 s"; tail -20 "$W/logs/kube-apiserver.log"; exit 1
fi
"$BIN/kube-controller-manager" --kubeconfig="$W/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$W/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$W/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=0 --leader-elect=false \
  --use-service-account-credentials=true --service-account-private-key-file="$PKI/sa.key" \
  --root-ca-file="$PKI/ca.crt" --cluster-signing-cert-file="$PKI/ca.crt" \
  --cluster-signing-key-file="$PKI/ca.key" "${DRA_GATES[@]}" --v=1 \
  > "$W/logs/kube-controller-manager.log" 2>&1 &
PIDS+=($!)
CP_S=$(python3 -c "import time; print(round(time.time() - $t, 1))")
echo "etcd, kube-apiserver ready, kube-controller-manager started in $CP_S s (API $E2E_API)"

export E2E_JSON=$OUT/gpu-e2e.json E2E_DEADLINE=$((T0 + BUDGET - 25)) E2E_SIM=$SIM
: > "$W/node-fault"
export E2E_NODE_FAULT=$W/node-fault
export E2E_HOST=$HOST_NODE E2E_EMULATED=$EMULATED E2E_SHAPED=emu-$SHAPED_I E2E_CRDS=$ROOT/crds E2E_GPUS=$G
python3 - <<PY
import json
json.dump({"rows": [{"step": "control plane", "took": "$CP_S s", "ok": True,
  "applied": "etcd, kube-apiserver, kube-controller-manager (tests/cluster/build.sh), admin and controller-manager client certificates",
  "decided": "kube-apiserver /readyz ok"}], "details": {}}, open("$E2E_JSON", "w"), indent=1)
PY

# ---- the nodes --------------------------------------------------------------------------
banner "nodes"
AGENT_BIN=$W/agent-bin
mkdir -p "$AGENT_BIN"
if [ $SIM = 0 ] && [ "$N" -gt 0 ]; then
  netns_setup
  netns_fresh "$N" || { echo "the emulated nodes could not be brought up"; N=0; EMULATED=""; export E2E_EMULATED=""; }
fi
POD_IPS=()
{
  echo "seed: 1"
  echo "nodes:"
  echo "  - {name: $HOST_NODE, product: $PRODUCT, gpus: $G, labels: {e2e.gpufabric.io/role: host}}"
  for i in $(seq 0 $((N - 1))); do
    own=""
    [ "$i" -lt "$OWN" ] && [ "$i" -ne "$SHAPED_I" ] && own=", e2e.gpufabric.io/own-gpu: 'true'"
    # Three topology blocks of two nodes (step 6).
    block=""
    [ "$N" -eq 6 ] && block=", e2e.gpufabric.io/block: $(echo abc | cut -c$((i / 2 + 1)))"
    echo "  - {name: emu-$i, product: $PRODUCT, gpus: 1, labels: {e2e.gpufabric.io/role: emulated$own$block}}"
    [ $SIM = 0 ] && POD_IPS+=(--pod-ip "emu-$i=192.0.2.$((10 + i))")
  done
} > "$W/fleet.yaml"
export E2E_FLEET=$W/fleet.yaml
cat "$W/fleet.yaml"
# fabric-agent as the pods find it: the real agent, with the wheels' NCCL; a pod of an
# emulated node runs in that node's namespace on its GPU (netns-nodes.sh exec).
{
  echo '#!/bin/sh'
  echo "export LD_LIBRARY_PATH='${LD_LIBRARY_PATH:-}' NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1"
  if [ $SIM = 1 ]; then
    echo "export FABRIC_BACKEND=sim"
  else
    # The host's hardware fault of the moment (gpu-e2e.py writes it): made here, on the
    # node's side, never in the FabricTest.
    echo "if [ \"\${FABRIC_NODE_NAME:-}\" = $HOST_NODE ]; then"
    echo "  case \"\$(cat '$W/node-fault' 2>/dev/null)\" in"
    echo "    hidden-gpu) export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((G - 2))) ;;"
    echo "    sdc) export FABRIC_TEST_FLIP_SDC_BIT=$((G - 1)) ;;"
    echo "  esac"
    echo "fi"
    echo 'case "${FABRIC_NODE_NAME:-}" in'
    echo "  emu-*) i=\${FABRIC_NODE_NAME#emu-}; export GPUS_OF_NODE=\$((i % $G)) DEBS='$ROOT/.device/debs'"
    echo "         exec bash '$ROOT/.device/netns-nodes.sh' exec \"\$i\" '$BIN/fabric-agent' \"\$@\" ;;"
    echo 'esac'
  fi
  echo "exec '$BIN/fabric-agent' \"\$@\""
} > "$AGENT_BIN/fabric-agent"
chmod +x "$AGENT_BIN/fabric-agent"
rm -rf "$W/pods"
OPERATOR_ARGS=()
if [ $REAL = 1 ]; then
  realnode_up "$HOST_NODE" || { echo "the real node could not be brought up"; exit 1; }
  OPERATOR_ARGS=(--agent-image "$AGENT_IMAGE")
  export E2E_NODE=real E2E_AGENT_IMAGE=$AGENT_IMAGE
else
  export E2E_KUBELET_START=$(date +%s.%N)
  RUST_LOG=info "$BIN/fabric-kubelet" --kubeconfig "$W/admin.kubeconfig" --fleet "$W/fleet.yaml" \
    --agent-bin-dir "$AGENT_BIN" --root-dir "$W/pods" "${POD_IPS[@]}" > "$W/logs/kubelet.log" 2>&1 &
  PIDS+=($!)
fi

banner "CRDs, namespace, nodes ready"
python3 bench/gpu-e2e.py setup || { echo "setup failed"; python3 bench/gpu-e2e.py table; exit 1; }

banner "operator"
RUST_LOG=info,gpufabric_operator=debug,kube=warn "$BIN/fabric-operator" run \
  --kubeconfig "$W/admin.kubeconfig" --pod-namespace "$NS" --admin-addr "127.0.0.1:$OP_PORT" \
  --metrics-auth none "${OPERATOR_ARGS[@]}" \
  > "$W/logs/operator.log" 2>&1 &
PIDS+=($!)
sleep 2
kill -0 "${PIDS[-1]}" 2>/dev/null || { echo "the operator exited:"; tail -20 "$W/logs/operator.log"; exit 1; }

banner "1. clean test over $HOST_NODE"
python3 bench/gpu-e2e.py clean
for fault in ${E2E_FAULTS:-hidden-gpu sdc}; do
  banner "2. hardware fault: $fault"
  python3 bench/gpu-e2e.py "fault:$fault"
  banner "3. release after $fault"
  python3 bench/gpu-e2e.py "release:$fault"
done
if [ $REAL = 1 ] && [ "$G" -ge 2 ]; then
  banner "4. two pods of $((G / 2)) GPUs on $HOST_NODE, each measuring its own"
  python3 bench/gpu-e2e.py own-gpus
elif [ $REAL = 1 ]; then
  banner "4. not run: two pods each measuring its own GPUs need 2 GPUs or more, $HOST_NODE has $G"
fi
if [ "$N" -gt 0 ]; then
  banner "4. node pairs over $EMULATED, emu-$SHAPED_I's link at $RATE"
  if [ $SIM = 0 ]; then
    export E2E_SHAPE_CMD="bash $ROOT/.device/netns-nodes.sh shape $SHAPED_I $RATE"
  fi
  python3 bench/gpu-e2e.py pairs
  if [ "$OWN" -ge 2 ]; then
    banner "5. the multi-node DDP probe"
    python3 bench/gpu-e2e.py probe
  else
    banner "5. not run: the multi-node probe needs 2 GPUs or more (nodes with a GPU of their own), the host has $G"
  fi
  banner "6. topology blocks: the multi-node NCCL sweep, the path inside block b at $PATH_RATE"
  if [ $SIM = 0 ]; then
    # The pair step's limit on emu-$SHAPED_I off (both ends), then the path emu-2 <-> emu-3 alone.
    tcb="LD_LIBRARY_PATH=/tmp/gf-iproute2/lib /tmp/gf-iproute2/sbin/tc"
    ipb="LD_LIBRARY_PATH=/tmp/gf-iproute2/lib /tmp/gf-iproute2/bin/ip"
    [ -x /tmp/gf-iproute2/bin/ip ] || ipb="LD_LIBRARY_PATH=/tmp/gf-iproute2/lib /tmp/gf-iproute2/sbin/ip"
    export E2E_UNSHAPE_CMD="$tcb qdisc del dev gfv$SHAPED_I root; $ipb netns exec gfn$SHAPED_I env $tcb qdisc del dev eth0 root"
    export E2E_SHAPE_PATH_CMD="DEBS=$ROOT/.device/debs bash $ROOT/.device/netns-nodes.sh shape-path 2 3 $PATH_RATE"
  fi
  python3 bench/gpu-e2e.py blocks
fi
banner "table"
python3 bench/gpu-e2e.py table
if [ "${E2E_KEEP:-0}" = 1 ]; then
  echo
  echo "The cluster stays up until Ctrl-C:"
  echo "  export KUBECONFIG=$W/admin.kubeconfig"
  echo "  kubectl get ft,ftr -o wide; kubectl get nodes -L gpufabric.io/result"
  echo "  curl -s $E2E_METRICS | grep ^gpufabric_node"
  trap 'exit 0' INT TERM
  while :; do sleep 3600 & wait $!; done
fi
