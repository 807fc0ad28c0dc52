# Sourced by bench/gpu-e2e.sh with E2E_NODE=real: the GPU host as a real Kubernetes node.
# Debian's containerd and runc, the CNI plugins, the kubelet that tests/cluster/build-node.sh
# builds, the GPU device plugin fixture (tests/cluster/deviceplugin: each /dev/nvidiaN one
# nvidia.com/gpu, a pod given only the device nodes and driver libraries of its own GPUs), and
# the agent image assembled here from deploy/images/build.sh's kit with this host's own NCCL
# and cuBLAS (deploy/images/assemble-agent.sh). Everything comes from .device/realnode, which
# `bench/gpu-e2e.sh pack-realnode` writes.
#
# realnode_pack       (here) .device/realnode/node.tar.xz and agent-kit.tar.xz
# realnode_up NAME    (there) containerd, the images, the kubelet registering NAME, the plugin;
#                     sets AGENT_IMAGE
# The node's fault of the moment is read by the plugin from $W/node-fault at each allocation
# (hidden-gpu: one allocated GPU's device node withheld; sdc: the agent's SDC test hook set).
#
# E2E_DRA=1 (at pack-realnode and at the run): the node runs DRA too, beside the device
# plugin: kube-scheduler, containerd 1.7 with CDI and the GPU DRA kubelet plugin fixture
# (tests/cluster/draplugin: the GPUs as devices of gpu.nvidia.com, a claim given its GPUs'
# device nodes and the driver's libraries through a CDI spec, the same fault file), all from
# tests/cluster/build-node.sh, and the DeviceClass gpu.nvidia.com; gpu-e2e.sh turns the DRA
# gates on in the control plane. The operator then asks for the host's GPUs through claims.

realnode_pack() {
  local node_bin stage rn=$ROOT/.device/realnode
  node_bin=${GPUFABRIC_NODE_BIN:-$(tests/cluster/build-node.sh)}
  stage=$(mktemp -d)
  mkdir -p "$stage/bin/cni" "$rn"
  cp "$node_bin/kubelet" "$node_bin/busybox" "$stage/bin/"
  if [ "${E2E_DRA:-0}" = 1 ]; then
    mkdir -p "$stage/bin/dra"
    cp "$node_bin/kube-scheduler" "$node_bin/gpu-dra-plugin" "$stage/bin/" &&
      cp "$node_bin/containerd" "$stage/bin/dra/containerd" ||
      { echo "E2E_DRA=1: kube-scheduler, gpu-dra-plugin, containerd 1.7: rerun tests/cluster/build-node.sh"; return 1; }
  fi
  # A DRA pack holds containerd 1.7 alone (Debian's 1.6 has no CDI), so that the pack stays
  # under what one call carries; its node runs only with E2E_DRA=1.
  if [ "${E2E_DRA:-0}" != 1 ]; then
    cp /usr/bin/containerd "$stage/bin/" || { echo "containerd: apt-get install containerd"; return 1; }
  fi
  cp /usr/bin/containerd-shim-runc-v2 /usr/bin/ctr /usr/sbin/runc "$stage/bin/" ||
    { echo "containerd, runc: apt-get install containerd runc"; return 1; }
  cp /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback "$stage/bin/cni/" ||
    { echo "CNI plugins: apt-get install containernetworking-plugins"; return 1; }
  (cd tests/cluster/deviceplugin && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" \
    -o "$stage/bin/gpu-device-plugin" .) || return 1
  strip "$stage/bin/kubelet" "$stage/bin/containerd" "$stage/bin/ctr" "$stage/bin/containerd-shim-runc-v2" \
    "$stage/bin/runc" 2>/dev/null || true
  tar -C "$stage" -cf - bin | xz -T0 -9 > "$rn/node.tar.xz"
  rm -rf "$stage"
  deploy/images/build.sh --only agent --binaries "${E2E_RUST_BIN:?E2E_RUST_BIN: the release binaries}" \
    --kit "$rn" --out "$(mktemp -d)" >&2 || return 1
  (cd "$rn" && sha256sum node.tar.xz agent-kit.tar.xz > manifest)
  du -sh "$rn"/*
}

realnode_ip() {
  # The host's first IPv4 address that is not loopback (the kubelet refuses a loopback node IP).
  python3 - <<'PY'
import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _, name in socket.if_nameindex():
    try:
        a = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
    except OSError:
        continue
    ip = socket.inet_ntoa(a[20:24])
    if not ip.startswith("127."):
        print(ip)
        break
PY
}

realnode_up() {
  local name=$1 rn=$ROOT/.device/realnode R=$W/realnode ip t
  RB=$W/realnode-bin
  if ! cmp -s "$rn/manifest" "$RB/manifest"; then
    rm -rf "$RB"; mkdir -p "$RB"
    xz -dc -T0 "$rn/node.tar.xz" | tar -C "$RB" --strip-components=1 -xf - ||
      { echo "cannot unpack $rn/node.tar.xz: run bench/gpu-e2e.sh pack-realnode here first"; return 1; }
    cp "$rn/manifest" "$RB/manifest"
  fi
  export PATH=$RB:$PATH
  rm -rf "$R"; mkdir -p "$R"/{cni/net.d,cni/ipam,containerd,kubelet,pod-logs,images,plugins,rootfs}
  ip=$(realnode_ip)
  if [ -z "$ip" ]; then
    # No address but loopback: one on a dummy interface, with the carried iproute2.
    bash "$ROOT/.device/netns-nodes.sh" down >/dev/null 2>&1 || true
    DEBS=$ROOT/.device/debs bash -c '. /dev/stdin' <<'SH' || true
R=/tmp/gf-iproute2; [ -x $R/bin/ip ] || [ -x $R/sbin/ip ] || { mkdir -p $R; for f in $DEBS/*.deb; do dpkg-deb -x $f $R; done; }
IPB=$R/bin/ip; [ -x $IPB ] || IPB=$R/sbin/ip
LD_LIBRARY_PATH=$R/lib $IPB link add gfnode0 type dummy; LD_LIBRARY_PATH=$R/lib $IPB addr add 192.0.2.250/32 dev gfnode0
LD_LIBRARY_PATH=$R/lib $IPB link set gfnode0 up
SH
    ip=192.0.2.250
  fi
  echo "node $name at $ip"
  local containerd=containerd cdi=""
  if [ "${E2E_DRA:-0}" != 1 ] && [ ! -x "$RB/containerd" ]; then
    echo "the pack is a DRA pack (containerd 1.7 only): run with E2E_DRA=1, or pack-realnode without it"
    return 1
  fi
  if [ "${E2E_DRA:-0}" = 1 ]; then
    [ -x "$RB/dra/containerd" ] && [ -x "$RB/gpu-dra-plugin" ] && [ -x "$RB/kube-scheduler" ] ||
      { echo "E2E_DRA=1: the pack holds no DRA binaries: E2E_DRA=1 bench/gpu-e2e.sh pack-realnode"; return 1; }
    containerd=$RB/dra/containerd
    mkdir -p "$R/cdi"
    cdi="  enable_cdi = true
  cdi_spec_dirs = [\"$R/cdi\"]"
  fi
  cat > "$R/containerd.toml" <<TOML
version = 2
root = "$R/containerd/root"
state = "$R/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$R/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$R/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/local/pause:1"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
$cdi
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "$RB/cni"
  conf_dir = "$R/cni/net.d"
  max_conf_num = 1
[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "$RB/runc"
  Root = "$R/containerd/runc"
TOML
  cat > "$R/cni/net.d/10-gpufabric.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "gpufabric", "plugins": [
  {"type": "bridge", "bridge": "gfcni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$R/cni/ipam", "ranges": [[{"subnet": "10.244.0.0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "loopback"}]}
JSON
  "$containerd" --config "$R/containerd.toml" > "$W/logs/containerd.log" 2>&1 &
  PIDS+=($!)
  for t in $(seq 1 100); do [ -S "$R/containerd.sock" ] && break; sleep 0.1; done
  CTR="ctr --address $R/containerd.sock -n k8s.io"
  "$containerd" --version; runc --version | head -1

  # The pod sandbox: busybox sleeping until told to stop.
  mkdir -p "$R/rootfs/bin" "$R/rootfs/tmp"
  cp "$RB/busybox" "$R/rootfs/bin/busybox"
  ln -s busybox "$R/rootfs/bin/sh"; ln -s busybox "$R/rootfs/bin/sleep"
  printf '#!/bin/sh\ntrap "exit 0" TERM INT\nwhile :; do sleep 3600 & wait $!; done\n' > "$R/rootfs/pause"
  chmod +x "$R/rootfs/pause"
  python3 deploy/images/oci.py --rootfs "$R/rootfs" --ref docker.io/local/pause:1 --entrypoint /pause \
    --mode tmp=1777 --out "$R/images/pause.tar" >/dev/null || return 1
  t=$(date +%s.%N)
  AGENT_IMAGE=$(deploy/images/assemble-agent.sh "$rn/agent-kit.tar.xz" "$R/images/agent.tar" | awk '{print $1}')
  [ -n "$AGENT_IMAGE" ] || { echo "the agent image could not be assembled"; return 1; }
  echo "agent image $AGENT_IMAGE assembled from the kit and this host's wheels in $(python3 -c "import time; print(round(time.time() - $t, 1))") s ($(du -h "$R/images/agent.tar" | cut -f1))"
  $CTR images import "$R/images/pause.tar" >/dev/null && $CTR images import "$R/images/agent.tar" >/dev/null ||
    { echo "ctr images import failed"; return 1; }
  $CTR images ls -q | grep -v '^sha256:'
  export AGENT_IMAGE

  cat > "$R/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: 10250
readOnlyPort: 0
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://$R/containerd.sock
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
localStorageCapacityIsolation: false
enforceNodeAllocatable: []
podLogsDir: $R/pod-logs
volumePluginDir: $R/plugins
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {}
registerNode: true
YAML
  local product gpus labels
  product=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | sed 's/^ *//; s/ *$//; s/ /-/g')
  gpus=$(nvidia-smi -L | wc -l)
  labels="nvidia.com/gpu.product=$product,nvidia.com/gpu.count=$gpus,e2e.gpufabric.io/role=host"
  export E2E_KUBELET_START=$(date +%s.%N)
  kubelet --config "$R/kubelet.yaml" --kubeconfig "$W/admin.kubeconfig" --root-dir "$R/kubelet" \
    --hostname-override "$name" --node-ip "$ip" --node-labels "$labels" --v=2 "${DRA_GATES[@]}" \
    > "$W/logs/kubelet.log" 2>&1 &
  PIDS+=($!)
  # The kubelet's device plugin directory is /var/lib/kubelet/device-plugins whatever its
  # --root-dir.
  for t in $(seq 1 300); do [ -S /var/lib/kubelet/device-plugins/kubelet.sock ] && break; sleep 0.1; done
  local lib
  lib=$(dirname "$(python3 -c 'import ctypes.util, subprocess; print(subprocess.run(["sh","-c","ldconfig -p | grep -m1 \"libcuda.so.1 \" | sed \"s/.*=> //\""],capture_output=True,text=True).stdout.strip())')")
  gpu-device-plugin -driver-lib "$lib" -fault-file "$W/node-fault" \
    > "$W/logs/device-plugin.log" 2>&1 &
  PIDS+=($!)
  sleep 1
  head -20 "$W/logs/device-plugin.log"
  if [ "${E2E_DRA:-0}" = 1 ]; then
    realnode_dra "$name" "$lib" || return 1
  fi
}

# The DRA side of the node (E2E_DRA=1): the scheduler (the operator's claim pods are placed,
# not bound), the DeviceClass the operator's claims name, and the DRA plugin beside the kubelet.
realnode_dra() {
  local name=$1 lib=$2
  kube-scheduler --kubeconfig "$W/admin.kubeconfig" --authentication-kubeconfig "$W/admin.kubeconfig" \
    --authorization-kubeconfig "$W/admin.kubeconfig" --leader-elect=false --secure-port=0 --v=1 \
    "${DRA_GATES[@]}" > "$W/logs/kube-scheduler.log" 2>&1 &
  PIDS+=($!)
  python3 - <<'PY' || { echo "the DeviceClass gpu.nvidia.com could not be created"; return 1; }
import os, requests
p = os.environ["E2E_PKI"]
r = requests.post(os.environ["E2E_API"] + "/apis/resource.k8s.io/v1beta1/deviceclasses",
                  verify=f"{p}/ca.crt", cert=(f"{p}/admin.crt", f"{p}/admin.key"), timeout=10,
                  json={"apiVersion": "resource.k8s.io/v1beta1", "kind": "DeviceClass",
                        "metadata": {"name": "gpu.nvidia.com"},
                        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}})
print("DeviceClass gpu.nvidia.com:", r.status_code)
raise SystemExit(0 if r.status_code in (201, 409) else 1)
PY
  gpu-dra-plugin -node-name "$name" -kubeconfig "$W/admin.kubeconfig" -kubelet-root "$R/kubelet" \
    -cdi-dir "$R/cdi" -driver-lib "$lib" -fault-file "$W/node-fault" \
    > "$W/logs/dra-plugin.log" 2>&1 &
  PIDS+=($!)
  sleep 2
  head -20 "$W/logs/dra-plugin.log"
}
