#!/usr/bin/env bash
# fabric-agent node-pair --backend cuda between emulated nodes on one GPU host: one network
# namespace per node (one GPU each; both share GPU 0 on a one-GPU host), NCCL over its
# network transport (sockets over veth),
# links shaped with tc; PyTorch's NCCL in the same namespaces as the reference.
#
#   bench/node-pair-check.sh [SIZE] [ROUNDS]   (default 256M, 3)
#   bench/node-pair-check.sh clique [SIZE] [ROUNDS]   both ranks on all of this host's GPUs
#       (G > 1 a node), as two hosts
#   bench/node-pair-check.sh peer-lost   a peer that meets the rendezvous and never joins
#       NCCL: rank 0 ends within the rendezvous timeout, not at the pod's deadline
#   bench/node-pair-check.sh localize [SIZE] [CLEAN] [SHAPED]   (default 64M, 5, 3)
#       four emulated nodes, all six pairs in three rounds (two pairs at once): CLEAN clean
#       runs, SHAPED runs with node 2's link at 2gbit, SHAPED runs with only the path
#       between nodes 0 and 3 at 2gbit; every pair document under $OUT/loc/<run>/, and
#       $OUT/loc.tgz. crates/health/tests/real_results.rs localizes them.
#
# Stages, logged to $OUT/node-pair-check.log, documents in $OUT:
#   host     two ranks on one host, no namespaces (NCCL's own choice: P2P over NVLink)
#   clean    nodes 0 and 1 in namespaces, ROUNDS pairs, then the PyTorch reference
#   shaped   node 1's link limited to 2 Gbit/s, ROUNDS pairs, then the reference
#
# Needs: .device/fabric-agent (release build), .device/netns-nodes.sh and .device/debs
# (iproute2 and its libraries, see netns-nodes.sh), PyTorch with its NCCL wheel, root.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MODE=pair
if [ "${1:-}" = localize ]; then MODE=localize; shift; fi
if [ "${1:-}" = peer-lost ]; then MODE=peer-lost; shift; fi
if [ "${1:-}" = clique ]; then MODE=clique; shift; fi
SIZE=${1:-256M}
ROUNDS=${2:-3}
[ $MODE = localize ] && { SIZE=${1:-64M}; CLEAN=${2:-5}; SHAPED=${3:-3}; }
OUT=${OUT:-$PWD/node-pair-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/node-pair-check.log") 2>&1
. "$(dirname "$0")/lib.sh"
netns_setup
bytes=$(python3 -c "import sys;s='$SIZE';m={'K':1<<10,'M':1<<20,'G':1<<30};print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))")

banner() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }


# pair NAME PREFIX0 PREFIX1 ADDR [NODES]: both ranks, rank 0's prefix (e.g. the netns exec)
# first; NODES (default node0,node1) names them in the documents.
pair() {
  local name=$1 p0=$2 p1=$3 addr=$4 nodes=${5:-node0,node1}
  mkdir -p "$(dirname "$OUT/$name")"
  local common=(node-pair --backend cuda --nodes "$nodes" --group "t/$name" --secret "$SECRET"
                --rendezvous "$addr:29400" -b "$SIZE" --collectives allReduce,sendRecv
                --rendezvous-timeout 60 --timeout 120 ${PAIR_ARGS:-})
  $p0 "$AGENT" "${common[@]}" --rank 0 --json "$OUT/$name-r0.json" > "$OUT/$name-r0.log" 2>&1 &
  local a=$!
  $p1 "$AGENT" "${common[@]}" --rank 1 --json "$OUT/$name-r1.json" > "$OUT/$name-r1.log" 2>&1
  local rb=$?
  wait $a; local ra=$?
  echo "$name: exit $ra / $rb"
  python3 - "$OUT/$name-r0.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no document:", e); sys.exit(0)
print("  transport", d.get("transport"), "nics", d.get("nicsUsed"), "gpus", d.get("gpusPerNode"),
      "errors", [e.get("message") for e in d.get("errors", [])], "not measured", d.get("notMeasured"))
for c in d.get("collectives", []):
    print("  %-10s %12d B %10.1f us algbw %7.2f busbw %7.2f GB/s wrong %d" % (
        c["collective"], c["bytes"], c["timeUs"], c["algbw"], c["busbw"], c["wrong"]))
PY
  grep -h "via NET\|via P2P\|via SHM" "$OUT/$name-r0.log" 2>/dev/null | head -2
}

reference() {
  local name=$1 p0=$2 p1=$3 addr=$4
  local env0=(env RANK=0 WORLD_SIZE=2 MASTER_ADDR=$addr MASTER_PORT=29500)
  local env1=(env RANK=1 WORLD_SIZE=2 MASTER_ADDR=$addr MASTER_PORT=29500)
  $p0 "${env0[@]}" python3 bench/pair_reference.py "$bytes" 20 > "$OUT/$name-ref-r0.log" 2>&1 &
  local a=$!
  $p1 "${env1[@]}" python3 bench/pair_reference.py "$bytes" 20 > "$OUT/$name-ref-r1.log" 2>&1
  wait $a
  grep -h "^REF" "$OUT/$name-ref-r0.log" || tail -5 "$OUT/$name-ref-r0.log"
}

# localize_run NAME: the six pairs of four nodes in three rounds, two pairs at once.
localize_run() {
  local run=$1
  for round in "0 1 2 3" "1 2 3 0" "0 2 1 3"; do
    set -- $round
    pair "loc/$run/$1-$2" "env GPUS_OF_NODE=0 $NETNS exec $1" "env GPUS_OF_NODE=0 $NETNS exec $2" \
      "192.0.2.$((10 + $1))" "node$1,node$2" > "$OUT/loc-$run-$1-$2.txt" &
    local first=$!
    pair "loc/$run/$3-$4" "env GPUS_OF_NODE=0 $NETNS exec $3" "env GPUS_OF_NODE=0 $NETNS exec $4" \
      "192.0.2.$((10 + $3))" "node$3,node$4" > "$OUT/loc-$run-$3-$4.txt"
    wait $first
    cat "$OUT/loc-$run-$1-$2.txt" "$OUT/loc-$run-$3-$4.txt"
  done
}

localize() {
  export PAIR_ARGS="--warmup 3 --iters 10"
  for i in $(seq 1 "$CLEAN"); do
    banner "clean run $i"; netns_fresh 4; localize_run "clean$i"
  done
  for i in $(seq 1 "$SHAPED"); do
    banner "node 2 at 2gbit, run $i"; netns_fresh 4
    $NETNS shape 2 2gbit; localize_run "node2slow$i"
  done
  for i in $(seq 1 "$SHAPED"); do
    banner "path 0-3 at 2gbit, run $i"; netns_fresh 4
    $NETNS shape-path 0 3 2gbit; localize_run "path03slow$i"
  done
  $NETNS down >/dev/null 2>&1
  (cd "$OUT" && tar czf loc.tgz loc)
  banner done
}

banner versions
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
"$AGENT" --version
# peer-lost: rank 1 (the sim backend) meets the rendezvous and never joins NCCL, as a peer
# that dies right after it would; the cuda rank 0 must not hang in ncclCommInitRank but end
# within --rendezvous-timeout with a not-measured document naming its peer (exit 3).
if [ $MODE = peer-lost ]; then
  banner "peer-lost: rank 1 meets the rendezvous, then never joins NCCL"
  lost=(node-pair --nodes h100-00,h100-01 --group t/lost --secret "$SECRET" -b 64M
        --rendezvous 127.0.0.1:29401 --rendezvous-timeout 20 --timeout 60)
  t0=$(date +%s)
  timeout 120 "$AGENT" "${lost[@]}" --backend cuda --rank 0 --json "$OUT/lost-r0.json" \
      > "$OUT/lost-r0.log" 2>&1 &
  a=$!
  "$AGENT" "${lost[@]}" --backend sim --fleet "$PWD/.device/demo-16.yaml" --rank 1 \
      --json "$OUT/lost-r1.json" > "$OUT/lost-r1.log" 2>&1
  rb=$?
  wait $a; ra=$?
  echo "peer-lost: rank 0 exit $ra after $(( $(date +%s) - t0 ))s (124 = hung until killed), rank 1 exit $rb"
  tail -3 "$OUT/lost-r0.log"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('rank 0 durationS:', d.get('durationS'), 'notMeasured:', d.get('notMeasured'))" "$OUT/lost-r0.json"
  banner "peer-lost control: both ranks cuda on this host, the same binary and watch"
  pair host-control "env NCCL_HOSTID=hostA" "env NCCL_HOSTID=hostB" 127.0.0.1
  exit 0
fi

# clique: both ranks see every GPU of this host, as two hosts (NCCL_HOSTID), so each
# rank's clique has G = the host's GPU count: the G > 1 init (G communicators in one NCCL
# group) and the collectives' G-GPU enqueue, NVLink within a "node", sockets between them.
if [ $MODE = clique ]; then
  G=$(nvidia-smi -L | wc -l)
  for i in $(seq 1 "$ROUNDS"); do
    banner "clique $i: two ranks, each with all $G GPUs, as two hosts"
    pair "clique$i" "env NCCL_HOSTID=hostA" "env NCCL_HOSTID=hostB" 127.0.0.1
  done
  banner "clique: PyTorch reference, $G processes a host, the same two host ids"
  pids=()
  for r in $(seq 0 $((2 * G - 1))); do
    host=hostA; [ "$r" -ge "$G" ] && host=hostB
    env NCCL_HOSTID=$host RANK=$r WORLD_SIZE=$((2 * G)) LOCAL_RANK=$((r % G)) GPUS_PER_NODE=$G \
      MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python3 bench/pair_reference.py "$bytes" 20 \
      > "$OUT/clique-ref-r$r.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  grep -h "^REF" "$OUT/clique-ref-r0.log" || tail -5 "$OUT/clique-ref-r0.log"
  exit 0
fi

if [ $MODE = localize ]; then localize; exit 0; fi

# With one GPU both emulated nodes use it: NCCL tells ranks apart by host (NCCL_HOSTID
# differs per namespace), so it sees two hosts with one GPU each.
NGPU=$(nvidia-smi -L | wc -l)
if [ "$NGPU" -ge 2 ]; then
  banner "host: two ranks, GPUs 0 and 1, no namespaces"
  pair host "env CUDA_VISIBLE_DEVICES=0" "env CUDA_VISIBLE_DEVICES=1" 127.0.0.1
else
  banner "host: two ranks sharing GPU 0 as two hosts (NCCL_HOSTID), no namespaces"
  pair host "env CUDA_VISIBLE_DEVICES=0 NCCL_HOSTID=hostA" "env CUDA_VISIBLE_DEVICES=0 NCCL_HOSTID=hostB" 127.0.0.1
fi

banner "namespaces up"
netns_fresh 2 || exit 1
G1=1; [ "$NGPU" -ge 2 ] || G1=0
N0="env GPUS_OF_NODE=0 $NETNS exec 0"; N1="env GPUS_OF_NODE=$G1 $NETNS exec 1"; A0=192.0.2.10

banner "clean: $ROUNDS pairs over the network transport"
for i in $(seq 1 "$ROUNDS"); do pair "clean$i" "$N0" "$N1" $A0; done
banner "clean: PyTorch reference"
reference clean "$N0" "$N1" $A0

banner "shaped: node 1's link at 2gbit"
$NETNS shape 1 2gbit
for i in $(seq 1 "$ROUNDS"); do pair "shaped$i" "$N0" "$N1" $A0; done
banner "shaped: PyTorch reference"
reference shaped "$N0" "$N1" $A0

$NETNS down >/dev/null 2>&1
banner done
