#!/usr/bin/env bash
# fabric-agent nccl-nodes --backend cuda on one GPU host, no namespaces: N ranks (default 4)
# on loopback, each its own host to NCCL (NCCL_HOSTID), so NCCL runs between them as between
# nodes (sockets over loopback, or shared memory / P2P where NCCL finds it on one host).
# With G >= N GPUs each rank gets G / N of them; with fewer, rank i uses GPU i mod G, ranks
# sharing a GPU (every rank with --shared-gpus: the other ranks' contexts are on its GPU).
# Prints each rank's exit code and rank 0's summary per node count; the node counts are
# 2, 4, ... and N, so N=4 measures 2 and 4 nodes, N=3 measures 2 and 3.
#
#   bench/nccl-nodes-check.sh [N] [MAX_BYTES]   (default 4, 64M)
#   AGENT=path/to/fabric-agent bench/nccl-nodes-check.sh ...   (default .device/fabric-agent)
#
# Documents and logs in $OUT (default ./nccl-nodes-out), summary in $OUT/nccl-nodes-check.log.
# Needs: the agent (release build), NCCL (a system libnccl, or PyTorch's wheel: lib.sh links
# it), nvidia-smi.
set -u
N=${1:-4}; MAX=${2:-64M}
OUT=${OUT:-$PWD/nccl-nodes-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/nccl-nodes-check.log") 2>&1
. "$(dirname "$0")/lib.sh"
wheel_libs
AGENT=${AGENT:-$PWD/.device/fabric-agent}
SECRET=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
NGPU=$(nvidia-smi -L | wc -l)
NODES=$(seq -s, -f "node%g" 0 $((N - 1)))
PORT=$((29400 + RANDOM % 500))
echo "=== $N ranks on $NGPU GPU(s), sizes 1K..$MAX ($(date -u +%H:%M:%S))"

# gpus_of I: rank I's CUDA_VISIBLE_DEVICES.
gpus_of() {
  if [ "$NGPU" -ge "$N" ]; then
    local per=$((NGPU / N))
    seq -s, $(($1 * per)) $(($1 * per + per - 1))
  else
    echo $(($1 % NGPU))
  fi
}

pids=()
for i in $(seq 0 $((N - 1))); do
  env CUDA_VISIBLE_DEVICES=$(gpus_of "$i") NCCL_HOSTID="nccl-nodes-$i" \
    FABRIC_TERMINATION_LOG="$OUT/termination-$i" \
    "$AGENT" nccl-nodes --backend cuda --shared-gpus \
    --nodes "$NODES" --rank "$i" --rendezvous 127.0.0.1:$PORT --group "bench/nccl-nodes" \
    --secret "$SECRET" -b 1K -e "$MAX" -f 4 --rendezvous-timeout 120 --timeout 120 \
    --json "$OUT/rank$i.json" > "$OUT/rank$i.log" 2>&1 &
  pids+=($!)
done
codes=""
for p in "${pids[@]}"; do wait "$p"; codes="$codes $?"; done
echo "exit codes:$codes"
grep -v '^{' "$OUT/rank0.log" | tail -n 200
python3 - "$OUT/rank0.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("no document:", e); sys.exit(1)
for p in d.get("points", []):
    for s in p["summary"]:
        print("NCCL-NODES nodes %d ranks %d %-15s busbw %.2f GB/s  small %.1f us  wrong %d" % (
            p["nodes"], p["ranks"], s["collective"], s["largeBusbw"], s["smallTimeUs"],
            s.get("wrong", 0)))
for e in d.get("errors", []):
    print("ERROR", e["message"])
if d.get("notMeasured"):
    print("NOT MEASURED", d["notMeasured"]["message"])
PY
