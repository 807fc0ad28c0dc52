#!/usr/bin/env bash
# One FabricTestRun over simulated nodes against a local control plane (process-kubelet):
# prints, and writes to $SCALE_OUT (default target/operator-scale.json; name a file under
# bench/results/ to keep it), the time to create
# every pod and the rate, the time from the last agent to the verdict, the largest object,
# the operator's peak RSS, the API server's requests by verb and resource (its own
# apiserver_request_total) per node, and the most nodes holding a benchmark pod at once.
#   SCALE_NODES=N   fleet size (default 1000)
#   SCALE_WAVE=10%  spec.rollout.maxUnavailable (default: every node at once)
#   SCALE_PROFILE=P cargo profile of the operator and the agents (default release)
#   SCALE_PAIRS=1   node checks at their lightest and the node-pair phase on (ring): adds per-round pods,
#                   round times and the phase's total time under "node_pairs"
#   SCALE_PACE=P    how long the sim agents' work lasts (FABRIC_SIM_PACE: h200 for the
#                   measured times of a 4 x H200 node, or a document); default: at once
#   SCALE_RUNS=2    a second run (run-now) after the first is folded, as the next night's:
#                   its times under "second_run"
#   SCALE_BAD=N     the last N nodes fail (a slow GPU pair; with SCALE_PAIRS=1 a slow
#                   network, found by the pairs and retested) and are cordoned at the first
#                   fold (failuresToQuarantine 1, no confirmation run): "quarantined_nodes"
#   SCALE_CONFIRM=1 with SCALE_BAD: the failing nodes are retested in a confirmation run and
#                   cordoned when they fail again (confirmRetest): its times under
#                   "confirmation"
#   SCALE_FULL=1    with SCALE_PAIRS: the node checks run the test's default suite first (a
#                   nightly's), not their lightest
#   SCALE_PROBE=1   the multi-node DDP probe (suite.ddpNodes, 16 nodes) after the node checks
#   SCALE_PARTNERS=1 with SCALE_PAIRS: one partner a node a night (suite.nodePairs.partners)
# Each pod role's first creation and last finish (server clock, after the run's start) are
# under "server_pods_by_role_after_start": the run's timeline by phase.
#   CARGO_TARGET_DIR where the binaries are built and taken from (default target/)
#   SCALE_BIN_DIR=D take fabric-operator and fabric-agent from D, built already (no build);
#                   the test itself still builds under CARGO_TARGET_DIR
# The load average before and after is recorded beside the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${GPUFABRIC_CLUSTER_BIN:-}" ]; then
    GPUFABRIC_CLUSTER_BIN="$(tests/cluster/build.sh)"
    export GPUFABRIC_CLUSTER_BIN
fi
# The operator and the agents as they ship: release builds (SCALE_PROFILE=dev for debug).
profile="${SCALE_PROFILE:-release}"
if [ -n "${SCALE_BIN_DIR:-}" ]; then
    bin_dir="$SCALE_BIN_DIR"
else
    cargo build --profile "$profile" -p gpufabric-agent -p gpufabric-operator
    target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
    case "$profile" in dev) bin_dir="$target_dir/debug" ;; *) bin_dir="$target_dir/$profile" ;; esac
fi
export GPUFABRIC_AGENT_BIN_DIR="$bin_dir"
export SCALE_OUT="${SCALE_OUT:-$PWD/target/operator-scale.json}"
# The test runs in tests/: a relative path is the repository's.
case "$SCALE_OUT" in /*) ;; *) SCALE_OUT="$PWD/$SCALE_OUT" ;; esac
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
cargo test -p gpufabric-tests --test operator_scale -- --ignored --nocapture a_run_over_many_nodes
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$SCALE_OUT" "$load_before" "$load_after" <<'PY'
import json, os, sys
path, before, after = sys.argv[1:4]
report = json.load(open(path))
report["machine"] = {
    "cpus": os.cpu_count(),
    "model": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), ""),
    "mem_gib": round(int(next(l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal"))) / 2**20, 1),
    "loadavg_before": before,
    "loadavg_after": after,
    "profile": os.environ.get("SCALE_PROFILE", "release"),
    "pace": os.environ.get("SCALE_PACE", ""),
}
json.dump(report, open(path, "w"), indent=1)
PY
cat "$SCALE_OUT"; echo
