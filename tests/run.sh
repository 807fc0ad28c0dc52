#!/usr/bin/env bash
# The project's test command: builds the binaries the integration tests run (fabric-agent,
# fabric-operator, fabric-kubelet) and the two images (deploy/images/build.sh), then every
# test of the workspace. Integration tests start a
# real kube-apiserver and etcd from tests/cluster/build.sh's cache (built on first use); the
# packaging tests use helm, prometheus and promtool from tests/tools/build.sh's cache; the
# real-node tests (as root) kubelet, kube-proxy and kube-scheduler from
# tests/cluster/build-node.sh's cache, and Debian's containerd, runc and CNI plugins. The
# binaries run two at once (tests/lanes.py), the real-node ones one after another.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${GPUFABRIC_CLUSTER_BIN:-}" ]; then
    GPUFABRIC_CLUSTER_BIN="$(tests/cluster/build.sh)"
    export GPUFABRIC_CLUSTER_BIN
fi
if [ -z "${GPUFABRIC_NODE_BIN:-}" ]; then
    GPUFABRIC_NODE_BIN="$(tests/cluster/build-node.sh)"
    export GPUFABRIC_NODE_BIN
fi
if [ -z "${GPUFABRIC_TOOLS_BIN:-}" ]; then
    GPUFABRIC_TOOLS_BIN="$(tests/tools/build.sh)"
    export GPUFABRIC_TOOLS_BIN
fi
if [ -z "${GPUFABRIC_IMAGES:-}" ]; then
    deploy/images/build.sh
    GPUFABRIC_IMAGES="$PWD/target/images"
    export GPUFABRIC_IMAGES
fi
cargo build --workspace --bins --locked
# With arguments (a filter, `-- --nocapture`), cargo runs the binaries one after another as
# always; without, tests/lanes.py runs two at once (GPUFABRIC_TEST_LANES to change that):
# most binaries wait on an API server, a kubelet or a pod, not on the CPU.
if [ $# -gt 0 ]; then
    cargo test --workspace --locked "$@"
else
    python3 tests/lanes.py --lanes "${GPUFABRIC_TEST_LANES:-2}"
fi
