#!/usr/bin/env bash
# Runs the cuda backend of fabric-agent on a multi-GPU host and writes logs and result
# documents under $OUT (default ./gpu-check-out).
#
#   bench/gpu-check.sh measure   versions, node-check --quick, node-check (default suite),
#                                PyTorch DDP reference (bench/ddp_reference.py)
#   bench/gpu-check.sh inject    a real slow pair and a real straggler beside node-check,
#                                then five clean runs
#   bench/gpu-check.sh all       both
#   bench/gpu-check.sh final     probe variants, then both
#   bench/gpu-check.sh ddp-modes [ROUNDS]  the DDP probe with one process for all GPUs
#                                and with one process per GPU, then PyTorch DDP, ROUNDS
#                                times (default 2), alternating the order
#   bench/gpu-check.sh ddp-process-checks  the one-process-per-GPU probe beside a straggler, with
#                                workers that cannot run, and node-check --quick
#   bench/gpu-check.sh ddp-compare [ROUNDS]  the DDP probe and PyTorch DDP, ROUNDS times
#                                (default 4), alternating which runs first; prints the
#                                efficiencies side by side (bench/ddp_compare.py)
#   bench/gpu-check.sh ddp-trace  one step's GPU timeline of the DDP probe (FABRIC_DDP_TRACE=1)
#                                and of PyTorch DDP (torch.profiler), and both one-GPU runs'
#                                GEMM kernels with their times under Nsight Compute
#
# The agent binary is taken from $AGENT, else .device/fabric-agent, else target/release.
# NCCL and cuBLAS are taken from PyTorch's wheels (nvidia-nccl-*, nvidia-cublas-*).
# NVLink multicast (NVLS) stays off: shared hosts can be put out of service by it.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
STAGE=${1:-all}
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
LOG=$OUT/gpu-check.log
exec > >(tee -a "$LOG") 2>&1

AGENT=${AGENT:-}
for cand in .device/fabric-agent target/release/fabric-agent; do
  [ -z "$AGENT" ] && [ -x "$cand" ] && AGENT=$cand
done
[ -z "$AGENT" ] && { echo "no fabric-agent binary found"; exit 1; }

# Libraries from the Python wheels under the names cudarc opens (bench/lib.sh).
. "$(dirname "$0")/lib.sh"
wheel_libs

banner() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

versions() {
  banner versions
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv
  nvidia-smi topo -m
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  ls -l $LIBS
  uname -r; nproc
}

check() { # name, extra args...
  local name=$1; shift
  banner "node-check $name: $*"
  local t0=$(date +%s.%N)
  timeout 200 "$AGENT" node-check --phase-timeout 120 --json "$OUT/$name.json" "$@" > "$OUT/$name.stdout" 2> "$OUT/$name.stderr"
  local rc=$?
  local t1=$(date +%s.%N)
  echo "rc=$rc wall=$(python3 -c "print(round($t1-$t0,1))") s"
  grep -v '^{' "$OUT/$name.stdout" | tail -60
  tail -5 "$OUT/$name.stderr"
  rm -f "$OUT/$name.stdout"
}

measure() {
  versions
  banner "no-GPU path: the agent must say why, not panic"
  CUDA_VISIBLE_DEVICES= timeout 60 "$AGENT" node-check --quick > /dev/null 2> "$OUT/nogpu.stderr"; echo "rc=$?"; tail -3 "$OUT/nogpu.stderr"; rm -f "$OUT/nogpu.stderr"
  check quick --quick
  cat "$OUT/quick.stderr" >> "$LOG"; rm -f "$OUT/quick.stderr"
  check full
  cat "$OUT/full.stderr" >> "$LOG"; rm -f "$OUT/full.stderr"
  banner "PyTorch DDP reference"
  timeout 400 python3 bench/ddp_reference.py > "$OUT/ddp_reference.out" 2>&1
  echo "rc=$?"; grep -v '^{' "$OUT/ddp_reference.out" | tail -20
  tail -1 "$OUT/ddp_reference.out" > "$OUT/ddp_reference.json"; rm -f "$OUT/ddp_reference.out"
}

inject() {
  local n; n=$(nvidia-smi -L | wc -l)
  local a=1 b=$((n - 1)) s=2
  [ "$n" -lt 3 ] && { a=0; b=1; s=1; }
  banner "slow pair $a,$b injected"
  "$AGENT" inject slow-pair --gpus $a,$b --seconds 90 &
  local pid=$!
  sleep 6
  check slowpair --no-nccl --no-ddp --no-health
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  cat "$OUT/slowpair.stderr" >> "$LOG"; rm -f "$OUT/slowpair.stderr"
  banner "straggler GPU $s injected"
  "$AGENT" inject straggler --gpu $s --seconds 120 &
  pid=$!
  sleep 6
  check straggler --no-nccl --no-pairs --no-health
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  cat "$OUT/straggler.stderr" >> "$LOG"; rm -f "$OUT/straggler.stderr"
  banner "five clean runs"
  : > "$OUT/clean.jsonl"
  for i in 1 2 3 4 5; do
    check clean$i --no-nccl --no-health
    python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))" "$OUT/clean$i.json" >> "$OUT/clean.jsonl"
    cat "$OUT/clean$i.stderr" >> "$LOG"; rm -f "$OUT/clean$i.stderr" "$OUT/clean$i.json"
  done
}

ddp_variants() { # the probe with one process for all GPUs vs one process per GPU
  for per_gpu in 0 1; do
    local v=ddp-process-per-gpu$per_gpu
    FABRIC_DDP_PROCESS_PER_GPU=$per_gpu check $v --no-nccl --no-pairs --no-health
    cat "$OUT/$v.stderr" >> "$LOG"; rm -f "$OUT/$v.stderr" "$OUT/$v.json"
  done
}

# One DDP probe run (node-check of the DDP phase only): run name, then VAR=value settings
# for the agent. Its document goes, with the run name, into $OUT/$RUNS (one file for all:
# a device call returns only a few files).
ddp_probe_run() {
  local v=$1; shift
  ( [ $# -gt 0 ] && export "$@"; check "$v" --no-nccl --no-pairs --no-health )
  grep 'ddp [0-9]' "$OUT/$v.stderr"
  cat "$OUT/$v.stderr" >> "$LOG"; rm -f "$OUT/$v.stderr"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d['run']=sys.argv[2]; print(json.dumps(d))" \
    "$OUT/$v.json" "$v" >> "$OUT/$RUNS" && rm -f "$OUT/$v.json"
}

# One PyTorch DDP reference run (bench/ddp_reference.py): run name.
ddp_torch_run() {
  banner "PyTorch DDP reference $1"
  timeout 300 python3 bench/ddp_reference.py > "$OUT/$1.out" 2>&1
  echo "rc=$?"; grep -v '^{' "$OUT/$1.out" | tail -8
  tail -1 "$OUT/$1.out" | sed "s/^{/{\"run\": \"$1\", /" >> "$OUT/$RUNS"
  rm -f "$OUT/$1.out"
}

ddp_modes() { # one process for all GPUs vs one process per GPU, beside PyTorch DDP
  nvidia-smi -L
  RUNS=ddp-modes.jsonl
  local rounds=${1:-2} r single
  for r in $(seq 1 "$rounds"); do
    local order="1 0"; [ $((r % 2)) -eq 0 ] && order="0 1"
    for single in $order; do
      ddp_probe_run "ddp-single$single-r$r" FABRIC_DDP_PROCESS_PER_GPU=$((1 - single))
    done
    ddp_torch_run "pytorch-r$r"
  done
}

ddp_compare() { # the DDP probe beside PyTorch DDP, alternating which goes first
  nvidia-smi -L
  RUNS=ddp-compare.jsonl
  local rounds=${1:-4} r
  for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then
      ddp_probe_run "probe-r$r"; ddp_torch_run "pytorch-r$r"
    else
      ddp_torch_run "pytorch-r$r"; ddp_probe_run "probe-r$r"
    fi
  done
  python3 bench/ddp_compare.py "$OUT/$RUNS"
}

ddp_process_checks() { # the probe with one process per GPU: straggler, bad worker, quick
  local s=2 pid
  export FABRIC_DDP_PROCESS_PER_GPU=1
  banner "straggler GPU $s injected beside the DDP probe (one process per GPU)"
  "$AGENT" inject straggler --gpu $s --seconds 60 &
  pid=$!
  sleep 6
  check straggler-procs --no-nccl --no-pairs --no-health
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  grep 'ddp [0-9]' "$OUT/straggler-procs.stderr"
  cat "$OUT/straggler-procs.stderr" >> "$LOG"; rm -f "$OUT/straggler-procs.stderr"
  python3 -c "import json,sys; print([(p['gpus'], [round(c / sorted(p['computeMs'])[len(p['computeMs']) // 2], 3) for c in p['computeMs']]) for p in json.load(open(sys.argv[1]))['ddp']['points']])" \
    "$OUT/straggler-procs.json"
  banner "workers that cannot run (FABRIC_DDP_WORKER_EXE=/bin/false): a clear phase error"
  FABRIC_DDP_WORKER_EXE=/bin/false check badworker --no-nccl --no-pairs --no-health
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['errors'])" "$OUT/badworker.json"
  cat "$OUT/badworker.stderr" >> "$LOG"; rm -f "$OUT/badworker.stderr"
  check quick --quick
  cat "$OUT/quick.stderr" >> "$LOG"; rm -f "$OUT/quick.stderr"
}

ddp_trace() { # where the probe's step and PyTorch DDP's step spend their time
  python3 -c 'import torch; print("preferred BLAS", torch.backends.cuda.preferred_blas_library())'
  banner "DDP probe timeline (FABRIC_DDP_TRACE=1)"
  FABRIC_DDP_TRACE=1 timeout 200 "$AGENT" node-check --no-nccl --no-pairs --no-health \
    --json "$OUT/trace-probe.json" > /dev/null 2> "$OUT/trace-probe.log"
  echo "rc=$?"; grep -E 'ddp [0-9] GPU|trace [0-9] GPU\(s\) gpu0: sum' "$OUT/trace-probe.log"
  banner "PyTorch DDP timeline (torch.profiler)"
  timeout 300 python3 bench/ddp_reference.py --trace > "$OUT/trace-torch.log" 2>&1
  echo "rc=$?"; grep -E '^pytorch|span|: sum' "$OUT/trace-torch.log"
  local ncu; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  [ -z "$ncu" ] && { echo "no ncu"; return; }
  banner "GEMM kernels of one GPU's steps ($ncu, clocks left alone)"
  local k='regex:gemm|nvjet|cutlass|xmma'
  timeout 150 "$ncu" --clock-control none -k "$k" -c 26 --metrics gpu__time_duration.sum \
    "$AGENT" node-check --no-nccl --no-pairs --no-health --ddp-gpu-counts 1 --quick > "$OUT/ncu-probe.txt" 2>&1
  echo "rc=$?"
  timeout 200 "$ncu" --target-processes all --clock-control none -k "$k" -c 26 --metrics gpu__time_duration.sum \
    python3 bench/ddp_reference.py --counts 1 --steps 1 --warmup 1 > "$OUT/ncu-torch.txt" 2>&1
  echo "rc=$?"
}

case $STAGE in
  ddp-trace) ddp_trace; exit 0 ;;
  ddp-process-checks) ddp_process_checks; exit 0 ;;
  ddp-modes) ddp_modes "${2:-2}"; exit 0 ;;
  ddp-compare) ddp_compare "${2:-4}"; exit 0 ;;
  ddp-variants) ddp_variants ;;
  final) ddp_variants; measure; inject ;;
  measure) measure ;;
  inject) inject ;;
  all) measure; inject ;;
  *) echo "usage: $0 measure|inject|all"; exit 2 ;;
esac
banner summary
python3 bench/summarize.py "$OUT"
