#!/usr/bin/env bash
# Checks the archives deploy/images/build.sh wrote, with the tools a node has:
#   1. skopeo reads each archive and finds the digest images.env names (what a push keeps);
#   2. a private containerd (its own root, state and socket under a temporary directory; the
#      host's containerd, if any, is not touched) imports both with `ctr images import` and
#      runs them as the image config says (user 65532): `fabric-operator --help`, and
#      `fabric-agent node-check` on the sim backend with a fleet shipped in the image, and the
#      loader resolves NCCL and cuBLAS inside the agent image.
# Step 2 needs root, containerd, ctr and runc; without them it is skipped, saying so.
#
#   deploy/images/check.sh [DIR]     (DIR: build.sh's --out, default target/images)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-target/images}
case $dir in -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
die() { echo "check.sh: $*" >&2; exit 1; }
[ -r "$dir/images.env" ] || die "$dir/images.env not found: run deploy/images/build.sh first"
# shellcheck disable=SC1091
. "$dir/images.env"
command -v skopeo >/dev/null || die "skopeo is needed: apt-get install skopeo"

for name in OPERATOR AGENT; do
    image=${name}_IMAGE digest=${name}_DIGEST archive=${name}_ARCHIVE
    [ -n "${!image:-}" ] || continue
    got=$(skopeo inspect --format '{{.Digest}} {{.Architecture}}' "oci-archive:${!archive}")
    [ "${got%% *}" = "${!digest}" ] || die "${!archive}: skopeo reads digest ${got%% *}, images.env says ${!digest}"
    user=$(skopeo inspect --config "oci-archive:${!archive}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["config"].get("User", ""))')
    [ "$user" = 65532:65532 ] || die "${!archive}: runs as '$user', not 65532:65532"
    echo "skopeo: ${!image} ${got%% *} (${got#* }, user $user)"
done

if [ "$(id -u)" != 0 ] || ! command -v containerd >/dev/null || ! command -v ctr >/dev/null || ! command -v runc >/dev/null; then
    echo "containerd check skipped: it needs root, containerd, ctr and runc (apt-get install containerd)"
    exit 0
fi
tmp=$(mktemp -d /tmp/gpufabric-images-check.XXXXXX)
cat > "$tmp/config.toml" <<EOF
version = 2
root = "$tmp/root"
state = "$tmp/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$tmp/containerd.sock"
[ttrpc]
  address = "$tmp/containerd.sock.ttrpc"
EOF
containerd --config "$tmp/config.toml" > "$tmp/containerd.log" 2>&1 &
pid=$!
stop() {
    kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    grep -o " $tmp/[^ ]*" /proc/mounts | sort -r | xargs -r -n 1 umount -l 2>/dev/null || true
    rm -rf "$tmp"
}
trap stop EXIT
ctr_() { ctr -a "$tmp/containerd.sock" -n k8s.io "$@"; }
for _ in $(seq 50); do ctr_ version >/dev/null 2>&1 && break; sleep 0.2; done
ctr_ version >/dev/null 2>&1 || { tail -5 "$tmp/containerd.log" >&2; die "the private containerd did not start"; }

if [ -n "${OPERATOR_IMAGE:-}" ]; then
    ctr_ images import "$OPERATOR_ARCHIVE" | grep -q "^unpacking $OPERATOR_IMAGE " \
        || die "ctr images import did not name $OPERATOR_IMAGE"
    ctr_ run --rm "$OPERATOR_IMAGE" gpufabric-check-operator fabric-operator --help | grep -q '^Usage: fabric-operator' \
        || die "$OPERATOR_IMAGE: fabric-operator --help did not run"
    echo "containerd: imported $OPERATOR_IMAGE, ran fabric-operator --help as 65532"
fi
if [ -n "${AGENT_IMAGE:-}" ]; then
    ctr_ images import "$AGENT_ARCHIVE" | grep -q "^unpacking $AGENT_IMAGE " \
        || die "ctr images import did not name $AGENT_IMAGE"
    ctr_ run --rm "$AGENT_IMAGE" gpufabric-check-agent fabric-agent node-check --backend sim \
        --fleet /usr/share/gpufabric/fleets/demo-16.yaml --node h100-03 > "$tmp/agent.out" 2>&1 \
        || { tail -5 "$tmp/agent.out" >&2; die "$AGENT_IMAGE: fabric-agent node-check on the sim backend failed"; }
    for lib in libnccl.so.2 libcublas.so.13; do
        ctr_ run --rm "$AGENT_IMAGE" gpufabric-check-ld /lib64/ld-linux-x86-64.so.2 --list "/opt/gpufabric/lib/$lib" > "$tmp/ld.out" 2>&1 \
            && ! grep -q 'not found' "$tmp/ld.out" \
            || { cat "$tmp/ld.out" >&2; die "$AGENT_IMAGE: $lib does not load"; }
    done
    echo "containerd: imported $AGENT_IMAGE, ran fabric-agent node-check (sim backend) as 65532; NCCL and cuBLAS load"
fi
