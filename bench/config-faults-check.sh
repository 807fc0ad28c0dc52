#!/usr/bin/env bash
# On a GPU host: a suite or an NCCL setting that cannot work must be the configuration's
# fault, never the node's. Writes logs under $OUT (default ./config-faults-out).
#
#   1. node-check -e 1T (an all_reduce of 1 TiB per GPU, more than any GPU holds): refused as
#      invalid input (exit 2) before any GPU work, the message naming the field;
#   2. NCCL_ALGO=PAT (an algorithm all_reduce does not have) in the agent's environment,
#      node-check --quick --verdict: the sweep is reported as the configuration's fault (an
#      Info finding), the node is not failed (exit 0 with --verdict), the rest is measured;
#   3. the same check without the setting, for comparison.
#
# The agent binary: $AGENT, else .device/fabric-agent. NCCL_NVLS_ENABLE=0 throughout.
set -u
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/config-faults-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/config-faults.log") 2>&1
AGENT=$(realpath "${AGENT:-.device/fabric-agent}")
. bench/lib.sh
wheel_libs
banner() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
status=0
expect() { # what, want, got
    echo "$1: exit $3 (want $2)"
    [ "$2" = "$3" ] || status=1
}

banner "node-check -e 1T"
timeout 120 "$AGENT" node-check -e 1T --json "$OUT/terabyte.json" > "$OUT/terabyte.txt" 2>&1
rc=$?; tail -n 5 "$OUT/terabyte.txt"
expect "1 TiB all_reduce" 2 $rc

banner "NCCL_ALGO=PAT node-check --quick --verdict"
NCCL_ALGO=PAT timeout 200 "$AGENT" node-check --quick --verdict --json "$OUT/pat.json" \
    > "$OUT/pat.txt" 2>&1
rc=$?
grep -iE "invalid|configuration|NCCL_ALGO|# Verdict|finding|unavailable" "$OUT/pat.txt" | head -n 20
expect "NCCL_ALGO=PAT" 0 $rc

banner "node-check --quick --verdict without it"
timeout 200 "$AGENT" node-check --quick --verdict --json "$OUT/plain.json" > "$OUT/plain.txt" 2>&1
rc=$?; grep -E "# Verdict" "$OUT/plain.txt"
expect "plain" 0 $rc

banner "done: $([ $status -eq 0 ] && echo all checks passed || echo SOME CHECKS FAILED)"
exit $status
