#!/usr/bin/env bash
# fabric-agent ddp-nodes --backend cuda over emulated nodes on one GPU host (one network
# namespace per node, one GPU each, NCCL over its socket transport on veth), beside PyTorch
# DDP run in the same namespaces with the same NCCL settings: step time and weak-scaling
# efficiency at 1, 2 (and 4, with 4 GPUs) nodes, ROUNDS times each.
#
#   bench/ddp-nodes-check.sh [ROUNDS] [HIDDEN] [LAYERS] [BATCH]   (default 3, 2048, 8, 131072)
#   bench/ddp-nodes-check.sh straggler [HIDDEN] [LAYERS] [BATCH]
#   NODES_N=4 bench/ddp-nodes-check.sh ...
#       4 emulated nodes whatever the GPU count: node i uses GPU i mod the GPU count, so
#       on 2 GPUs two nodes share each GPU (NCCL sees distinct hosts; their GEMMs share
#       the GPU, the same for the agent and PyTorch).
#       one clean round, then one round with `fabric-agent inject straggler` loading the
#       last node's GPU (every rank with --shared-gpus, the load being other work on that
#       GPU): that node, and no other, must be named a straggler.
#
#   AGENT_ONLY=1 bench/ddp-nodes-check.sh ...
#       the agent's rounds alone (no PyTorch reference)
#   TRACE=1 bench/ddp-nodes-check.sh ...
#       also each rank's timeline of its last timed step (`ddp-nodes --trace`) in the agent's
#       logs, and PyTorch's GPU timeline of one more step (torch.profiler, PROFILE=1) in
#       rank 0's reference log: where each side's all-reduces start and end beside backward.
#
# The default shape puts compute and the gradient all-reduce of the same order over
# sockets (~3 GB/s): 134 MB of fp32 gradients against about 50 ms of GEMMs per step; the
# node probe's own shape (8192 x 8, batch 4096) would be almost all communication here.
# Documents and logs in $OUT (default ./ddp-nodes-out), summary in $OUT/ddp-nodes-check.log.
# Needs: .device/fabric-agent (release build), .device/netns-nodes.sh and .device/debs
# (iproute2 and its libraries, see netns-nodes.sh), PyTorch with its NCCL wheel, root.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MODE=compare
if [ "${1:-}" = straggler ]; then MODE=straggler; shift; set -- 1 "$@"; fi
ROUNDS=${1:-3}; HIDDEN=${2:-2048}; LAYERS=${3:-8}; BATCH=${4:-131072}
STEPS=10; WARMUP=3
[ "${TRACE:-0}" = 1 ] && export FABRIC_DDP_TRACE=true PROFILE=1
OUT=${OUT:-$PWD/ddp-nodes-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/ddp-nodes-check.log") 2>&1
. "$(dirname "$0")/lib.sh"
netns_setup
banner() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

NGPU=$(nvidia-smi -L | wc -l)
N=2; [ "$NGPU" -ge 4 ] && N=4
N=${NODES_N:-$N}
NODES=$(seq -s, -f "node%g" 0 $((N - 1)))
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
nvidia-smi -L
banner "namespaces up: $N emulated nodes, shape $LAYERS x $HIDDEN, batch $BATCH per GPU"
netns_fresh $N || exit 1
A0=192.0.2.10
gpu_of() { echo $(($1 % NGPU)); }

# agent_round R [ARGS...]: one round of every rank, each with ARGS too.
agent_round() {
  local r=$1 pids=()
  shift
  for i in $(seq 0 $((N - 1))); do
    env GPUS_OF_NODE=$(gpu_of $i) $NETNS exec $i "$AGENT" ddp-nodes --backend cuda "$@" \
      --nodes "$NODES" --rank $i --rendezvous $A0:29400 --group "t/ddp$r" --secret "$SECRET" \
      --hidden $HIDDEN --layers $LAYERS --batch-per-gpu $BATCH --steps $STEPS --warmup $WARMUP \
      --rendezvous-timeout 60 --timeout 240 --json "$OUT/agent$r-r$i.json" \
      > "$OUT/agent$r-r$i.log" 2>&1 &
    pids+=($!)
  done
  local codes=""
  for p in "${pids[@]}"; do wait "$p"; codes="$codes $?"; done
  echo "agent round $r: exit codes$codes"
  python3 - "$OUT/agent$r-r0.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no document:", e); sys.exit(0)
for p in d.get("points", []):
    print("  AGENT nodes %d gpus %d step %.2f ms efficiency %.1f%% compute %.2f comm alone %.2f exposed %.2f" % (
        p["nodes"], p["gpus"], p["stepMs"], p["scalingEfficiency"] * 100, p["computeAloneMs"],
        p["commAloneMs"], p["exposedCommMs"]))
for s in d.get("stragglers", []):
    print("  straggler", s)
for e in d.get("errors", []):
    print("  error", e.get("message"))
if d.get("notMeasured"):
    print("  not measured", d["notMeasured"])
PY
}

reference_round() {
  local r=$1 k pids i
  for k in $(python3 -c "n=$N; c=[1]; [c.append(c[-1]*2) for _ in range(8) if c[-1]*2<n]; print(*sorted(set(c+[n])))"); do
    pids=()
    for i in $(seq 0 $((k - 1))); do
      env GPUS_OF_NODE=$(gpu_of $i) $NETNS exec $i env RANK=$i WORLD_SIZE=$k MASTER_ADDR=$A0 \
        MASTER_PORT=$((29500 + r * 10 + k)) python3 bench/ddp_nodes_reference.py \
        $HIDDEN $LAYERS $BATCH $STEPS $WARMUP > "$OUT/ref$r-k$k-r$i.log" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    grep -h "^REF" "$OUT/ref$r-k$k-r0.log" || tail -3 "$OUT/ref$r-k$k-r0.log"
  done
}

if [ $MODE = straggler ]; then
  banner "straggler: clean round"
  agent_round clean
  last=$((N - 1))
  banner "straggler: node$last's GPU $(gpu_of $last) loaded by fabric-agent inject straggler"
  CUDA_VISIBLE_DEVICES=$(gpu_of $last) "$AGENT" inject straggler --gpu 0 --seconds 120 \
    > "$OUT/inject.log" 2>&1 &
  inj=$!
  sleep 5
  # The injected load is other work on that GPU: without --shared-gpus its rank refuses the
  # GPU (exit 14) and the probe is not measured, which is right for a pod and says nothing
  # here. With it, every rank measures beside the load and the loaded node is the straggler.
  agent_round loaded --shared-gpus
  kill $inj 2>/dev/null; wait $inj 2>/dev/null
  $NETNS down >/dev/null 2>&1
  banner done
  exit 0
fi

for r in $(seq 1 "$ROUNDS"); do
  banner "round $r: fabric-agent ddp-nodes"
  agent_round $r
  [ "${AGENT_ONLY:-0}" = 1 ] && continue
  banner "round $r: PyTorch DDP"
  reference_round $r
done
$NETNS down >/dev/null 2>&1
banner "summary"
python3 - "$OUT" "$ROUNDS" <<'PY'
import glob, json, os, re, sys
out, rounds = sys.argv[1], int(sys.argv[2])
for r in range(1, rounds + 1):
    try:
        d = json.load(open(os.path.join(out, f"agent{r}-r0.json")))
        agent = {p["nodes"]: p for p in d.get("points", [])}
    except Exception:
        agent = {}
    ref = {}
    for f in glob.glob(os.path.join(out, f"ref{r}-k*-r0.log")):
        for line in open(f):
            if line.startswith("REF "):
                j = json.loads(line[4:])
                ref[j["world"]] = j
    base_a = agent.get(1, {}).get("stepMs")
    base_r = ref.get(1, {}).get("step_ms")
    for k in sorted(set(agent) | set(ref)):
        a, t = agent.get(k), ref.get(k)
        ea = a["scalingEfficiency"] * 100 if a else float("nan")
        er = base_r / t["step_ms"] * 100 if (t and base_r) else float("nan")
        print("round %d nodes %d: agent step %s ms eff %.1f%% | PyTorch step %s ms eff %.1f%% | diff %.1f points" % (
            r, k, "%.2f" % a["stepMs"] if a else "-", ea, "%.2f" % t["step_ms"] if t else "-", er, ea - er))
PY
banner done
