#!/usr/bin/env bash
# One FabricTestRun over 1000 simulated nodes against a local control plane: prints (and
# writes to bench/operator-scale.json) the time to create every pod, to fold the results
# into the run status, the status size and the operator's peak RSS. SCALE_NODES=N changes
# the fleet size.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${GPUFABRIC_CLUSTER_BIN:-}" ]; then
    GPUFABRIC_CLUSTER_BIN="$(tests/cluster/build.sh)"
    export GPUFABRIC_CLUSTER_BIN
fi
cargo build -p gpufabric-agent -p gpufabric-operator
export SCALE_OUT="${SCALE_OUT:-$PWD/bench/operator-scale.json}"
cargo test -p gpufabric-tests --test operator_scale -- --ignored --nocapture
cat "$SCALE_OUT"; echo
