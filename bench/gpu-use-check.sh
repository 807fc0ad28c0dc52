#!/usr/bin/env bash
# Other work on a node's GPUs, on real GPUs: the agent must not measure beside it (exit 14,
# the GPU and what it holds named), must measure with --shared-gpus, and must not fail the
# node when that work has taken a GPU's memory (the allocation's error is Unavailable, not a
# fault); the ranks of node-pair and ddp-nodes end at once the same way. Also:
# CUDA_LAUNCH_BLOCKING=1 with several GPUs gives Unavailable phases at once, not a hang.
# Work that starts while the check measures ends it with exit 14 too, and clean checks
# (the agent's own memory before and after its measurements, logged) must not.
# Each case's stderr, termination message, document and verdict go to $OUT (default
# ./gpu-use-out); summary.txt has one line per case.
#
#   OUT=... AGENT=.device/fabric-agent bash bench/gpu-use-check.sh [CASE...]
#
# CASE: held (1, 2, 2b), idle (3), blocking (4), during (5), procs (6), ranks (7; ddp-during
# alone: its last part); default all.
# The other work is a PyTorch process (the wheel that ships the NCCL the agent loads)
# holding GPU memory and sleeping, or with BUSY=1 multiplying matrices until killed.
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-$PWD/gpu-use-out}
AGENT=${AGENT:-.device/fabric-agent}
mkdir -p "$OUT"
SUM=$OUT/summary.txt
: > "$SUM"
# The agent loads libnccl.so: PyTorch's libnccl.so.2 under that name.
NCCL_LIB=$(python3 -c "import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], 'lib'))")
mkdir -p /tmp/gf-use-lib
ln -sf "$NCCL_LIB/libnccl.so.2" /tmp/gf-use-lib/libnccl.so
export LD_LIBRARY_PATH=/tmp/gf-use-lib:$NCCL_LIB:${LD_LIBRARY_PATH:-}

nvidia-smi --query-gpu=index,memory.used,memory.reserved,memory.total --format=csv > "$OUT/idle-memory.csv" 2>&1

# hold GPU LEAVE_GIB: allocate all of the GPU's free memory but LEAVE_GIB (or HOLD_GIB when
# set), print "held", sleep until killed.
hold() {
  local gpu=$1
  python3 - "$gpu" <<'PY' > "$OUT/holder-$gpu.log" 2>&1 &
import os, sys, time, torch
gpu = int(sys.argv[1])
torch.cuda.set_device(gpu)
free, total = torch.cuda.mem_get_info()
if os.environ.get("HOLD_GIB"):
    n = int(float(os.environ["HOLD_GIB"]) * 2**30)
else:
    n = free - int(float(os.environ.get("LEAVE_GIB", "2")) * 2**30)
x = torch.empty(n, dtype=torch.uint8, device=f"cuda:{gpu}")
x.fill_(1)
torch.cuda.synchronize()
free2, _ = torch.cuda.mem_get_info()
print(f"held {n / 2**30:.1f} GiB of GPU {gpu}; {free2 / 2**30:.1f} GiB free of {total / 2**30:.1f}", flush=True)
if os.environ.get("BUSY"):
    a = torch.randn(8192, 8192, device=f"cuda:{gpu}")
    t = time.time()
    while time.time() - t < 600:
        a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
time.sleep(600)
PY
  HOLDER=$!
  for _ in $(seq 1 120); do
    grep -q '^held' "$OUT/holder-$gpu.log" 2>/dev/null && break
    sleep 0.5
  done
  cat "$OUT/holder-$gpu.log"
  # A case whose other work never started would read as a clean check: say so.
  grep -q '^held' "$OUT/holder-$gpu.log" 2>/dev/null ||
    echo "== the other work on GPU $gpu did not start: $(tail -1 "$OUT/holder-$gpu.log")" | tee -a "$SUM"
}

# stop_holder: the holder ends, by SIGKILL when SIGTERM has not ended it in 10 s.
stop_holder() {
  kill "$HOLDER" 2>/dev/null
  for _ in $(seq 1 20); do
    kill -0 "$HOLDER" 2>/dev/null || break
    sleep 0.5
  done
  kill -9 "$HOLDER" 2>/dev/null
  wait "$HOLDER" 2>/dev/null
}

# case NAME ARGS...: one node-check, with its outputs under $OUT/NAME.*
case_() {
  local name=$1
  shift
  local t0=$SECONDS
  start_ "$name" "$@"
  wait "$AGENT_PID"
  report_ "$name" $? "$t0" "$@"
}

# start_ NAME ARGS...: a node-check in the background ($AGENT_PID), its memory readings
# before and after its measurements logged.
start_() {
  local name=$1
  shift
  RUST_LOG=gpufabric_measure=info FABRIC_TERMINATION_LOG=$OUT/$name.term timeout 300 \
    "$AGENT" node-check --node gpu-use --verdict --verdict-json "$OUT/$name.verdict.json" \
    --json "$OUT/$name.json" "$@" > "$OUT/$name.stdout" 2> "$OUT/$name.stderr" &
  AGENT_PID=$!
}

# report_ NAME RC T0 ARGS...: the case's line in the summary.
report_() {
  local name=$1 rc=$2 t0=$3
  shift 3
  local errs=""
  [ -s "$OUT/$name.json" ] && errs=$(python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
print('; '.join(f\"{e['phase']} {e['kind']}: {e['message'][:160]}\" for e in d.get('errors', [])) or 'no phase error')
" "$OUT/$name.json")
  local verdict=""
  [ -s "$OUT/$name.verdict.json" ] && verdict=$(python3 -c "
import json, sys
v = json.load(open(sys.argv[1]))
print(v.get('verdict'), [(f.get('severity'), f.get('kind')) for f in v.get('findings', [])])
" "$OUT/$name.verdict.json")
  {
    echo "== $name: exit $rc in $((SECONDS - t0)) s; args: $*"
    echo "   termination: $(head -c 400 "$OUT/$name.term" 2>/dev/null)"
    echo "   stderr tail: $(grep -v '^\[' "$OUT/$name.stderr" | tail -2 | tr '\n' ' ' | head -c 600)"
    [ -n "$errs" ] && echo "   errors: $errs"
    [ -n "$verdict" ] && echo "   verdict: $verdict"
    grep 'once the contexts were open' "$OUT/$name.stderr" |
      sed -E 's/\x1b\[[0-9;]*m//g; s/.*(gpu=[0-9]+ .*processes=[0-9]+).*/   memory: \1/'
  } | tee -a "$SUM"
}

CASES=" ${*:-held idle blocking during procs ranks} "
want() { [[ $CASES == *" $1 "* ]]; }

if want held; then
# 1. A process holds 40 GiB of the last GPU and sleeps: not measured (exit 14), then measured
#    with --shared-gpus.
HOLD_GIB=40 hold $(( $(nvidia-smi -L | wc -l) - 1 ))
case_ held-40g --quick --no-ddp
case_ held-40g-shared --quick --no-ddp --shared-gpus
stop_holder

# 2. A process has taken all but 2 GiB of GPU 0: with --shared-gpus the sweep's 1 GiB buffers
#    do not fit. The phase is Unavailable (the GPU's memory is taken), not a fault.
LEAVE_GIB=2 hold 0
case_ full-gpu0 --no-ddp --collectives all_reduce -w 1 -n 2
case_ full-gpu0-shared --no-ddp --collectives all_reduce -w 1 -n 2 --shared-gpus
stop_holder

# 2b. The ranks of node-pair and ddp-nodes refuse the same way, at once, before meeting
#     their peers (rank 1 alone; rank 0 is never started).
HOLD_GIB=8 hold 1
rank_() {
  local name=$1 cmd=$2
  local t0=$SECONDS
  FABRIC_TERMINATION_LOG=$OUT/$name.term FABRIC_RENDEZVOUS_SECRET=00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff \
    timeout 60 "$AGENT" "$cmd" --nodes a,b --rank 1 --rendezvous 127.0.0.1:29511 --group gpu-use \
    --rendezvous-timeout 20 > "$OUT/$name.stdout" 2> "$OUT/$name.stderr"
  local rc=$?
  {
    echo "== $name: exit $rc in $((SECONDS - t0)) s; $cmd rank 1"
    echo "   termination: $(head -c 300 "$OUT/$name.term" 2>/dev/null)"
  } | tee -a "$SUM"
}
rank_ node-pair-held node-pair
rank_ ddp-nodes-held ddp-nodes
stop_holder
fi

# 3. Nothing else on the GPUs: measured, passed.
want idle && case_ idle --quick --no-ddp

# 4. CUDA_LAUNCH_BLOCKING=1 with every GPU in one process: Unavailable, at once.
want blocking && CUDA_LAUNCH_BLOCKING=1 case_ launch-blocking --quick --no-pairs

if want during; then
# 5. The default check twice on idle GPUs (what the agent's own contexts hold before and
#    after its measurements), then work that starts while it measures: a process that takes
#    8 GiB of GPU 1 DELAY s (default 4) after the check started and multiplies matrices on
#    it. The check must end with exit 14, naming GPU 1, and not fail the node.
case_ clean-default-1
case_ clean-default-2
t0=$SECONDS
start_ started-during
sleep "${DELAY:-4}"
HOLD_GIB=8 BUSY=1 hold 1
wait "$AGENT_PID"
report_ started-during $? "$t0" "(default suite; work on GPU 1 from ${DELAY:-4} s)"
stop_holder
# The same with --shared-gpus: measured, and what the work costs counts against the node.
t0=$SECONDS
start_ started-during-shared --shared-gpus
sleep "${DELAY:-4}"
HOLD_GIB=8 BUSY=1 hold 1
wait "$AGENT_PID"
report_ started-during-shared $? "$t0" --shared-gpus
stop_holder
fi

# 6. The DDP probe with one process per GPU: those processes have ended before the check's
#    last look at the GPUs, which must not take them for other work.
want procs && case_ ddp-procs --no-pairs --ddp-process-per-gpu

# 7. Both ranks of node-pair and of ddp-nodes on this host (rank 0 on GPUs 0-1, rank 1 on
#    GPUs 2-3; needs 4 GPUs): on idle GPUs both measure and neither takes its own memory for
#    other work; then a process that takes 8 GiB of GPU 3 8 s after the start and multiplies
#    matrices on it: rank 1 writes its document as not measured, rank 0 measures.
ranks_() { # NAME CMD WORK ARGS...: WORK=1 starts the holder on GPU 3
  local name=$1 cmd=$2 work=$3
  shift 3
  local t0=$SECONDS r0 r1 rc0 rc1 r
  local common=(--nodes a,b --rendezvous 127.0.0.1:29513 --group "$name" --rendezvous-timeout 90)
  for r in 0 1; do
    local devs=0,1
    [ $r = 1 ] && devs=2,3
    RUST_LOG=gpufabric_measure=info CUDA_VISIBLE_DEVICES=$devs FABRIC_TERMINATION_LOG=$OUT/$name-r$r.term \
      FABRIC_RENDEZVOUS_SECRET=00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff \
      timeout 240 "$AGENT" "$cmd" "${common[@]}" --rank $r "$@" \
      > "$OUT/$name-r$r.stdout" 2> "$OUT/$name-r$r.stderr" &
    [ $r = 0 ] && r0=$! && sleep 1
    [ $r = 1 ] && r1=$!
  done
  if [ "$work" = 1 ]; then
    sleep 8
    HOLD_GIB=8 BUSY=1 hold 3
  fi
  wait "$r0"; rc0=$?
  wait "$r1"; rc1=$?
  [ "$work" = 1 ] && stop_holder
  {
    echo "== $name: rank 0 exit $rc0, rank 1 exit $rc1 in $((SECONDS - t0)) s; $cmd $*"
    for r in 0 1; do
      echo "   rank $r: $(head -c 500 "$OUT/$name-r$r.term" 2>/dev/null)"
      grep 'once the contexts were open' "$OUT/$name-r$r.stderr" |
      sed -E 's/\x1b\[[0-9;]*m//g; s/.*(gpu=[0-9]+ .*processes=[0-9]+).*/   memory: \1/'
    done
  } | tee -a "$SUM"
}
if want ranks; then
  ranks_ pair-clean node-pair 0
  ranks_ ddp-clean ddp-nodes 0
  ranks_ pair-during node-pair 1 --iters 4000
fi
# The probe's timed steps long enough that the work starts while they run.
want ranks || want ddp-during && ranks_ ddp-during ddp-nodes 1 --steps 400
