#!/usr/bin/env bash
# Same-run comparisons: nccl-tests, nvbandwidth and fabric-agent back to back on one host,
# on identical parameters, then the ratios (bench/compare.py). Logs and documents go
# under $OUT (default ./compare-out).
#
#   bench/compare.sh build    build nccl-tests and nvbandwidth from $SRC (their sources,
#                             fetched on the development machine and carried; never
#                             committed) into $REF; nvbandwidth links the Boost
#                             program_options carried in $BOOST
#   bench/compare.sh sweep    nccl-tests' seven binaries (-b 8 -e 1G -f 8 -w 5 -n 20 -c 1
#                             -g N, one process each), then the agent's sweep with the same
#                             flags in one process, SWEEP_ROUNDS times (default 2) in
#                             alternating order; wall times
#   bench/compare.sh steady   the sweep's seven collectives at 8 B - 1 MiB with enough
#                             iterations that nccl-tests' own time per size settles
#                             (STEADY_FLAGS, default -w 50 -n 1000), STEADY_ROUNDS times
#                             (default 3) in alternating order, into $OUT/steady, then
#                             compare.py's ratios of that folder: small-message times judged
#                             where the reference repeats itself
#                             (sweep and steady also time a fixed CPU loop before each process
#                             into host-speed.txt, to set beside the two small-message states)
#   bench/compare.sh graph    the sweep with CUDA graphs in both tools (GRAPH_FLAGS, default
#                             the sweep's flags and -G 1: each block's -n iterations recorded
#                             into one graph per GPU and launched), GRAPH_ROUNDS times (default
#                             3) into $OUT/graph, then the ratios: small sizes timed with the
#                             host's launches taken out of both tools alike
#   bench/compare.sh paired   small sizes (PAIRED_FLAGS, default -b 8 -e 1M -f 8 -w 5 -n 20),
#                             PAIRED_ROUNDS times (default 3), both tools started one right
#                             after the other per collective (the order turning), first both
#                             on one CPU (taskset; the CPU that runs a fixed loop fastest at
#                             the start of the round) into $OUT/paired-pinned, then unpinned
#                             into $OUT/paired-free (PAIRED_PIN="1 0"; 0 for the second
#                             only); the ratios of each. On a host whose CPUs
#                             are not all equally fast, this sets the two tools' launch paths
#                             side by side from the same CPU in the same minute
#   bench/compare.sh states   all_reduce and broadcast at 8 B - 4 KiB (-w 5 -n 20), STATES_RUNS
#                             processes of each tool (default 6) per setting that could decide
#                             which of the two small-message states a process lands in (none;
#                             CUDA_DEVICE_MAX_CONNECTIONS=1 and 32; address randomisation off;
#                             CUDA_MODULE_LOADING=EAGER; NCCL_LAUNCH_MODE=GROUP), into
#                             $OUT/states; each process's median time per collective
#   bench/compare.sh copies   nvbandwidth's copy-engine tests (256 MiB), then the agent's
#                             pair matrix (256 MiB)
#   bench/compare.sh faults   an NCCL setting that cuts bus bandwidth (NCCL_MAX_NCHANNELS=1,
#                             then NCCL_P2P_DISABLE=1), a one-way copy load (bench/one_way_load.py),
#                             five clean runs
#   bench/compare.sh all      build, sweep, copies, faults, then the ratios
#   bench/compare.sh clocks   one steady round of each tool (STEADY_FLAGS) with the GPUs' SM
#                             clocks sampled every 100 ms (nvidia-smi) and every line
#                             timed, into $OUT/clocks; bench/clocks.py sets each small-size
#                             time beside the clock it ran at. A diagnostic: the sampling
#                             costs host time, so its times are not ratios
#   bench/compare.sh large    LARGE_COLLS (default alltoall sendrecv) at 16 MiB - 1 GiB,
#                             -w 5 -n 20, LARGE_ROUNDS times (default 3): nccl-tests, the
#                             agent and, when $AGENT_B names another build, that build, the
#                             order turning each round; ratios of each agent into
#                             $OUT/large-a and $OUT/large-b
#   bench/compare.sh point    one collective's first size under several settings: POINT_COLL
#                             (default all_reduce), POINT_FLAGS (settings separated by '|',
#                             default 16 MiB alone at -n 20 and -n 200, and 16 MiB - 1 GiB at
#                             -n 200; leading NAME=value words set both tools' environment),
#                             POINT_ROUNDS rounds (default 4), both tools per setting
#                             (the order turning), into $OUT/point; the first size's out-of-
#                             and in-place times side by side, the agent's GPU event time
#                             beside its host time: whether a gap is in the first iterations
#                             (it shrinks at -n 200) or in the buffers moving through 1 GiB;
#                             with $AGENT_B, that build as a third (the order turning)
#   bench/compare.sh layout   nccl-tests against itself where its buffers lie: all_reduce_perf
#                             built again into $REF/nccl-tests-pad with one line added (by
#                             sed, here; nothing of its code is kept) that first takes
#                             GF_PAD_MIB of device memory per GPU with ncclMemAlloc, then
#                             16 MiB (LAYOUT_FLAGS, default -b 16M -e 16M -w 5 -n 200) at pads
#                             LAYOUT_PADS (default 0 2 4 8 18), LAYOUT_ROUNDS times (default 3),
#                             into $OUT/layout, the agent once a round beside them; out- and
#                             in-place times per pad: how far the place of the buffers alone
#                             moves the reference at that size
#   bench/compare.sh latency  all_reduce 8 B - 1 MiB, three rounds: nccl-tests, the agent as it
#                             runs by default (NCCL's INFO log to a file, for the transports),
#                             and the agent with NCCL_DEBUG=WARN; times side by side
#
# The agent binary is $AGENT, else the first of $DEV/fabric-agent, .device/fabric-agent and
# target/release/fabric-agent that exists; without one, every stage but build stops at once.
# NCCL is PyTorch's wheel (nvidia-nccl-*): nccl-tests builds against its nccl.h and
# libnccl.so.2, and the agent loads the same library. NVLink multicast (NVLS) stays off
# everywhere: shared hosts can be put out of service by it.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
HERE=$(cd "$(dirname "$0")" && pwd)
DEV=${DEV:-.device/gpu-bench}
SRC=${SRC:-$DEV/src}
BOOST=${BOOST:-$DEV/boost}
REF=${REF:-/tmp/gf-ref}
OUT=${OUT:-$PWD/compare-out}
mkdir -p "$OUT" "$REF"
LOG=$OUT/compare.log
exec > >(tee -a "$LOG") 2>&1

AGENT=${AGENT:-}
for cand in "$DEV/fabric-agent" .device/fabric-agent target/release/fabric-agent; do
  [ -z "$AGENT" ] && [ -x "$cand" ] && AGENT=$cand
done
# Every stage but build runs the agent: stop before minutes of reference runs without one.
if [ -z "$AGENT" ] && [ "${*:-all}" != build ]; then
  echo "no fabric-agent: set AGENT, or put a release build at $DEV/fabric-agent," \
    ".device/fabric-agent or target/release/fabric-agent" >&2
  exit 2
fi

# NCCL from the Python wheel, as a home nccl-tests can build against, and on the library
# path under the name cudarc opens (libnccl.so).
NCCL_HOME=/tmp/gf-nccl
SP=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null)
NCCL_DIR=$(dirname "$(find "$SP/nvidia" -path '*nccl*' -name 'libnccl.so.2' 2>/dev/null | head -1)")
mkdir -p $NCCL_HOME/lib
ln -sfn "$NCCL_DIR/../include" $NCCL_HOME/include
ln -sf "$NCCL_DIR/libnccl.so.2" $NCCL_HOME/lib/libnccl.so
ln -sf "$NCCL_DIR/libnccl.so.2" $NCCL_HOME/lib/libnccl.so.2
export LD_LIBRARY_PATH=$NCCL_HOME/lib:${LD_LIBRARY_PATH:-}
NGPU=$(nvidia-smi -L | wc -l)
SWEEP_FLAGS="-b 8 -e 1G -f 8 -w 5 -n 20"
COLLS="all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv"

banner() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
now() { date +%s.%N; }
since() { python3 -c "print(f'{$(now) - $1:.2f}')"; }

# make_nccl_tests DIR LOG: nccl-tests in DIR against the wheel's NCCL, for this host's GPUs.
make_nccl_tests() {
  local cc; cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  ( cd "$1" && make -j16 MPI=0 CUDA_HOME=/usr/local/cuda NCCL_HOME=$NCCL_HOME \
      NVCC_GENCODE="-gencode=arch=compute_$cc,code=sm_$cc" ) > "$2" 2>&1
}

build() {
  banner "build nccl-tests and nvbandwidth ($NGPU GPUs, nvcc $(nvcc --version | tail -1))"
  local cc; cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  local t0; t0=$(now)
  rm -rf "$REF/nccl-tests" "$REF/nvbandwidth"
  cp -r "$SRC/nccl-tests" "$SRC/nvbandwidth" "$REF/"
  ( make_nccl_tests "$REF/nccl-tests" "$OUT/build-nccl-tests.log"
    echo "nccl-tests rc=$?" ) &
  local p1=$!
  ( cd "$REF/nvbandwidth" && nvcc -O3 -std=c++17 -arch=sm_$cc -DGIT_VERSION='"v0.8"' -I. \
      -isystem "$OLDPWD/$BOOST/include" testcase.cpp testcases_ce.cpp testcases_sm.cpp kernels.cu \
      memcpy.cpp nvbandwidth.cpp multinode_memcpy.cpp multinode_testcases.cpp output.cpp \
      json_output.cpp json/jsoncpp.cpp "$OLDPWD/$BOOST/lib/libboost_program_options.a" \
      -L/usr/local/cuda/lib64/stubs -lnvidia-ml -lcuda -o nvbandwidth > "$OUT/build-nvbandwidth.log" 2>&1
    echo "nvbandwidth rc=$?" ) &
  # Named pids: a bare `wait` would also wait for the tee of this script's output.
  wait $p1 $!
  tail -3 "$OUT/build-nccl-tests.log" "$OUT/build-nvbandwidth.log"
  ls "$REF/nccl-tests/build/"*_perf "$REF/nvbandwidth/nvbandwidth" 2>&1
  echo "build wall $(since "$t0") s"
}

# host_speed LABEL: one line in $OUT/host-speed.txt with the time of a fixed loop on this CPU
# and the kernel's clock of the cores this script may run on. Small-message times sit in one
# of two states per process (bench/results/h200x4-2026-11-26-compare.md); this says whether the
# host's own speed moves with them.
host_speed() {
  python3 - "$1" >> "$OUT/host-speed.txt" <<'PY'
import os, sys, time
t = time.perf_counter()
s = 0
for i in range(1_000_000):
    s += i
loop = (time.perf_counter() - t) * 1e3
cpus = sorted(os.sched_getaffinity(0))
mhz = []
for c in cpus[:4]:
    try:
        mhz.append(int(open(f"/sys/devices/system/cpu/cpu{c}/cpufreq/scaling_cur_freq").read()) // 1000)
    except OSError:
        pass
print(f"{sys.argv[1]:<32} loop {loop:7.2f} ms  cpus {cpus[0]}-{cpus[-1]}  MHz {mhz or 'n/a'}")
PY
}

nccl_tests_sweep() { # round
  banner "nccl-tests, seven processes: $SWEEP_FLAGS -c 1 -g $NGPU"
  local t0; t0=$(now)
  for c in $COLLS; do
    host_speed "nccl-tests $c r$1"
    timeout 300 "$REF/nccl-tests/build/${c}_perf" $SWEEP_FLAGS -c 1 -g "$NGPU" > "$OUT/nccltests-$c-r$1.txt" 2>&1
    echo "$c rc=$?"
  done
  echo "nccl-tests wall $(since "$t0") s" | tee "$OUT/nccltests-wall-r$1.txt"
}

agent_sweep() { # round
  banner "fabric-agent sweep, one process: $SWEEP_FLAGS"
  local t0; t0=$(now)
  host_speed "agent r$1"
  timeout 300 "$AGENT" node-check --no-pairs --no-ddp --no-health --no-compute $SWEEP_FLAGS \
    --json "$OUT/agent-sweep-r$1.json" > /dev/null 2> "$OUT/agent-sweep-r$1.log"
  echo "agent rc=$? wall $(since "$t0") s" | tee "$OUT/agent-wall-r$1.txt"
  grep -E 'all_reduce +[0-9]+ ' "$OUT/agent-sweep-r$1.log" | head -4
}

layout() {
  local d=$OUT/layout r pad
  local flags=${LAYOUT_FLAGS:-"-b 16M -e 16M -w 5 -n 200"} pads=${LAYOUT_PADS:-"0 2 4 8 18"}
  mkdir -p "$d"
  banner "layout: all_reduce_perf $flags at pads of $pads MiB, ${LAYOUT_ROUNDS:-3} rounds"
  rm -rf "$REF/nccl-tests-pad"
  cp -r "$SRC/nccl-tests" "$REF/nccl-tests-pad"
  # The one added line: GF_PAD_MIB of device memory taken (and kept) before the buffers.
  sed -i '/^testResult_t AllocateBuffs(/a\    { const char* gfPad = getenv("GF_PAD_MIB"); if (gfPad \&\& atoi(gfPad) > 0) { void* gfPadBuf; NCCLCHECK(ncclMemAlloc(\&gfPadBuf, (size_t)atoi(gfPad) << 20)); } }' \
    "$REF/nccl-tests-pad/src/common.cu"
  grep -n 'GF_PAD_MIB' "$REF/nccl-tests-pad/src/common.cu" || { echo "layout: the pad line was not added"; return 1; }
  make_nccl_tests "$REF/nccl-tests-pad" "$d/build.log" || { tail -5 "$d/build.log"; return 1; }
  for r in $(seq 1 "${LAYOUT_ROUNDS:-3}"); do
    for pad in $pads; do
      GF_PAD_MIB=$pad timeout 120 "$REF/nccl-tests-pad/build/all_reduce_perf" $flags -c 1 -g "$NGPU" \
        > "$d/pad$pad-r$r.txt" 2>&1
    done
    timeout 120 "$AGENT" node-check --no-pairs --no-ddp --no-health --collectives all_reduce $flags \
      > /dev/null 2> "$d/agent-r$r.log"
  done
  python3 - "$d" "$pads" <<'LAYOUT' | tee "$d/layout.txt"
import sys, statistics as st
d, pads = sys.argv[1], sys.argv[2].split()
def first(path):
    for l in open(path, errors="replace"):
        f = l.split()
        if len(f) > 9 and f[0].isdigit() and not l.lstrip().startswith("#"):
            return float(f[5]), float(f[-4])
    return float("nan"), float("nan")
print("all_reduce_perf, first size: time per iteration, us, by pad before the buffers")
print(f"{'pad MiB':>8} {'rounds out of place':>32} {'median':>8} {'rounds in place':>32} {'median':>8}")
meds = {}
for p in pads:
    rows = []
    for r in range(1, 100):
        try:
            rows.append(first(f"{d}/pad{p}-r{r}.txt"))
        except FileNotFoundError:
            break
    o = [x[0] for x in rows]; i = [x[1] for x in rows]
    meds[p] = (st.median(o), st.median(i))
    print(f"{p:>8} {' '.join(f'{x:.2f}' for x in o):>32} {meds[p][0]:>8.2f} {' '.join(f'{x:.2f}' for x in i):>32} {meds[p][1]:>8.2f}")
for k, name in ((0, "out of place"), (1, "in place")):
    v = [m[k] for m in meds.values()]
    print(f"nccl-tests {name}: medians {min(v):.2f}-{max(v):.2f} us over the pads, slowest / fastest {max(v) / min(v):.4f}")
import re
pat = re.compile(r"\]\s+\S+\s+(\d+)\s+([\d.]+) us .*?in-place\s+([\d.]+) us")
rows = []
for r in range(1, 100):
    try:
        for l in open(f"{d}/agent-r{r}.log", errors="replace"):
            m = pat.search(l)
            if m:
                rows.append((float(m.group(2)), float(m.group(3))))
                break
    except FileNotFoundError:
        break
if rows:
    o = [x[0] for x in rows]; i = [x[1] for x in rows]
    print(f"{'agent':>8} {' '.join(f'{x:.2f}' for x in o):>32} {st.median(o):>8.2f} {' '.join(f'{x:.2f}' for x in i):>32} {st.median(i):>8.2f}")
LAYOUT
}

latency() {
  [ -x "$REF/nccl-tests/build/all_reduce_perf" ] || build
  local flags="-b 8 -e 1M -f 8 -w 5 -n 20"
  for round in 1 2 3; do
    banner "latency round $round: all_reduce $flags"
    "$REF/nccl-tests/build/all_reduce_perf" $flags -g "$NGPU" > "$OUT/lat-nt-r$round.txt" 2>&1
    "$AGENT" node-check --no-pairs --no-ddp --no-health --collectives all_reduce $flags \
      > /dev/null 2> "$OUT/lat-agent-r$round.log"
    NCCL_DEBUG=WARN "$AGENT" node-check --no-pairs --no-ddp --no-health --collectives all_reduce \
      $flags > /dev/null 2> "$OUT/lat-warn-r$round.log"
    python3 - "$OUT" "$round" <<'PY'
import re, sys
out, r = sys.argv[1], sys.argv[2]
def nt(path):
    rows = {}
    for line in open(path):
        f = line.split()
        if len(f) > 6 and f[0].isdigit() and f[2] == "float":
            rows[int(f[0])] = float(f[5])
    return rows
def agent(path):
    rows = {}
    for line in open(path):
        m = re.search(r"all_reduce +(\d+) +([\d.]+) us", line)
        if m:
            rows[int(m.group(1))] = float(m.group(2))
    return rows
a, b, c = nt(f"{out}/lat-nt-r{r}.txt"), agent(f"{out}/lat-agent-r{r}.log"), agent(f"{out}/lat-warn-r{r}.log")
print(f"{'bytes':>9} {'nccl-tests':>11} {'agent':>8} {'agent WARN':>11}")
for k in sorted(a):
    print(f"{k:>9} {a[k]:>11.2f} {b.get(k, float('nan')):>8.2f} {c.get(k, float('nan')):>11.2f}")
PY
  done
}

clocks() {
  local d=$OUT/clocks flags=${STEADY_FLAGS:-"-b 8 -e 1M -f 8 -w 50 -n 1000"} c
  mkdir -p "$d"
  banner "clocks: one steady round of each tool, SM clocks sampled every 100 ms"
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,pstate,utilization.gpu,power.draw \
    --format=csv,noheader,nounits -lms 100 > "$d/gpu-clocks.csv" 2>&1 &
  local smi=$!
  sleep 1
  for c in $COLLS; do
    echo "$(now) start $c" >> "$d/marks.txt"
    timeout 300 "$REF/nccl-tests/build/${c}_perf" $flags -c 1 -g "$NGPU" > "$d/nccltests-$c.txt" 2>&1
    echo "$(now) end $c" >> "$d/marks.txt"
  done
  timeout 300 "$AGENT" node-check --no-pairs --no-ddp --no-health $flags 2>&1 >/dev/null |
    while IFS= read -r l; do echo "$(now) $l"; done > "$d/agent.log"
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  python3 "$HERE/clocks.py" "$d" | tee "$d/clocks.txt"
}

large() {
  local flags="-b 16M -e 1G -f 8 -w 5 -n 20" r c
  local colls=${LARGE_COLLS:-"alltoall sendrecv"} names
  names=$(echo "$colls" | tr ' ' ,)
  mkdir -p "$OUT/large-a" "$OUT/large-b"
  banner "large: $colls $flags, nccl-tests, $AGENT${AGENT_B:+ and $AGENT_B}"
  for r in $(seq 1 "${LARGE_ROUNDS:-3}"); do
    local order="nt a b"
    [ $((r % 3)) = 2 ] && order="a b nt"
    [ $((r % 3)) = 0 ] && order="b nt a"
    for who in $order; do
      case $who in
        nt) for c in $colls; do
              timeout 300 "$REF/nccl-tests/build/${c}_perf" $flags -c 1 -g "$NGPU" \
                > "$OUT/large-a/nccltests-$c-r$r.txt" 2>&1
              cp "$OUT/large-a/nccltests-$c-r$r.txt" "$OUT/large-b/"
            done ;;
        a) timeout 300 "$AGENT" node-check --no-pairs --no-ddp --no-health --collectives "$names" \
             $flags --json "$OUT/large-a/agent-sweep-r$r.json" > /dev/null 2> "$OUT/large-a/agent-r$r.log"
           echo "round $r agent rc=$?" ;;
        b) [ -n "${AGENT_B:-}" ] || continue
           timeout 300 "$AGENT_B" node-check --no-pairs --no-ddp --no-health --collectives "$names" \
             $flags --json "$OUT/large-b/agent-sweep-r$r.json" > /dev/null 2> "$OUT/large-b/agent-r$r.log"
           echo "round $r agent B rc=$?" ;;
      esac
    done
  done
  echo "--- $AGENT"
  python3 "$HERE/compare.py" "$OUT/large-a" | tee "$OUT/large-a/ratios.txt"
  if [ -n "${AGENT_B:-}" ]; then
    echo "--- $AGENT_B"
    python3 "$HERE/compare.py" "$OUT/large-b" | tee "$OUT/large-b/ratios.txt"
  fi
}

point() {
  local d=$OUT/point c=${POINT_COLL:-all_reduce} r i v
  local variants=${POINT_FLAGS:-"-b 16M -e 16M -w 5 -n 20|-b 16M -e 16M -w 5 -n 200|-b 16M -e 1G -f 8 -w 5 -n 200"}
  mkdir -p "$d"
  banner "point: $c under $variants, ${POINT_ROUNDS:-4} rounds"
  IFS='|' read -r -a vs <<< "$variants"
  for r in $(seq 1 "${POINT_ROUNDS:-4}"); do
    for i in "${!vs[@]}"; do
      # Leading NAME=value words are the environment of both tools for that setting.
      local envs=() flags=() w
      for w in ${vs[$i]}; do
        if [ ${#flags[@]} = 0 ] && [[ $w == [A-Z]*=* ]]; then envs+=("$w"); else flags+=("$w"); fi
      done
      # The order turns each round and setting: nt a (b), a (b) nt, ...
      local who_all=(nt a) k
      [ -n "${AGENT_B:-}" ] && who_all+=(b)
      for k in "${!who_all[@]}"; do
        local who=${who_all[$(((k + r + i) % ${#who_all[@]}))]}
        case $who in
          nt) env "${envs[@]}" timeout 300 "$REF/nccl-tests/build/${c}_perf" "${flags[@]}" -c 1 -g "$NGPU" \
                > "$d/nt-v$i-r$r.txt" 2>&1 ;;
          a) env "${envs[@]}" timeout 300 "$AGENT" node-check --no-pairs --no-ddp --no-health \
               --collectives "$c" "${flags[@]}" \
               > /dev/null 2> "$d/agent-v$i-r$r.log" ;;
          b) env "${envs[@]}" timeout 300 "$AGENT_B" node-check --no-pairs --no-ddp --no-health \
               --collectives "$c" "${flags[@]}" \
               > /dev/null 2> "$d/agentb-v$i-r$r.log" ;;
        esac
      done
    done
  done
  printf '%s\n' "${vs[@]}" > "$d/variants.txt"
  python3 - "$d" "$c" <<'POINT' | tee "$d/point.txt"
import re, sys, statistics as st
d, c = sys.argv[1], sys.argv[2]
vs = open(f"{d}/variants.txt").read().splitlines()
def nt(path):
    for l in open(path, errors="replace"):
        f = l.split()
        if len(f) > 9 and f[0].isdigit() and not l.lstrip().startswith("#"):
            return float(f[5]), float(f[-4]) if f[-4] != "N/A" else float("nan")
    return float("nan"), float("nan")
pat = re.compile(r"\]\s+\S+\s+(\d+)\s+([\d.]+) us .*?in-place\s+([\d.]+) us .*gpu-event ([\d.]+) / ([\d.]+) us")
def agent(path):
    for l in open(path, errors="replace"):
        m = pat.search(l)
        if m:
            return tuple(float(x) for x in m.groups()[1:])
    return (float("nan"),) * 4
import glob
import os
for tag in ("agent", "agentb"):
  if not os.path.exists(f"{d}/{tag}-v0-r1.log"):
    continue
  print(f"{c}, first size: time per iteration, us (nccl-tests host; {'the agent' if tag == 'agent' else 'agent B'} host and GPU event)")
  print(f"{'setting':<32} {'round':>5} {'nt out':>8} {'agent':>8} {'gpu':>8} {'ratio':>6}  {'nt in':>8} {'agent':>8} {'gpu':>8} {'ratio':>6}")
  for i, v in enumerate(vs):
    rows = []
    for r in range(1, 100):
        try:
            a, b = nt(f"{d}/nt-v{i}-r{r}.txt"), agent(f"{d}/{tag}-v{i}-r{r}.log")
        except FileNotFoundError:
            break
        rows.append((a, b))
        print(f"{v:<32} {r:>5} {a[0]:>8.2f} {b[0]:>8.2f} {b[2]:>8.2f} {a[0]/b[0]:>6.3f}  {a[1]:>8.2f} {b[1]:>8.2f} {b[3]:>8.2f} {a[1]/b[1]:>6.3f}")
    if rows:
        med = lambda k, j: st.median(x[k][j] for x in rows)
        print(f"{v:<32} {'med':>5} {med(0,0):>8.2f} {med(1,0):>8.2f} {med(1,2):>8.2f} {med(0,0)/med(1,0):>6.3f}  {med(0,1):>8.2f} {med(1,1):>8.2f} {med(1,3):>8.2f} {med(0,1)/med(1,1):>6.3f}")
print("ratio: nccl-tests time / agent time (busbw agent / nccl-tests)")
POINT
}

sweep() { # SWEEP_ROUNDS rounds (default 2), the order alternating
  local r
  for r in $(seq 1 "${SWEEP_ROUNDS:-2}"); do
    if [ $((r % 2)) = 1 ]; then nccl_tests_sweep "$r"; agent_sweep "$r"
    else agent_sweep "$r"; nccl_tests_sweep "$r"; fi
  done
}

rounds_in() { # folder, flags, rounds: both tools in alternating order, then the ratios
  local out=$OUT flags=$SWEEP_FLAGS r
  OUT=$out/$1 SWEEP_FLAGS=$2
  mkdir -p "$OUT"
  for r in $(seq 1 "$3"); do
    if [ $((r % 2)) = 1 ]; then nccl_tests_sweep "$r"; agent_sweep "$r"
    else agent_sweep "$r"; nccl_tests_sweep "$r"; fi
  done
  banner "$1 ratios"
  python3 "$HERE/compare.py" "$OUT" | tee "$OUT/ratios.txt"
  OUT=$out SWEEP_FLAGS=$flags
}

steady() {
  rounds_in steady "${STEADY_FLAGS:-"-b 8 -e 1M -f 8 -w 50 -n 1000"}" "${STEADY_ROUNDS:-3}"
}

graph() {
  rounds_in graph "${GRAPH_FLAGS:-"$SWEEP_FLAGS -G 1"}" "${GRAPH_ROUNDS:-3}"
}

# fastest_cpu: the allowed CPU that runs a fixed loop fastest now (best of three). On a
# shared host some CPUs run it up to twice as slow at any moment, and which ones moves
# (bench/results/h200x2-2026-11-26-compare.md).
fastest_cpu() {
  python3 - <<'PY'
import os, time
def loop():
    t = time.perf_counter()
    s = 0
    for i in range(200_000):
        s += i
    return time.perf_counter() - t
times = []
for c in sorted(os.sched_getaffinity(0)):
    os.sched_setaffinity(0, {c})
    times.append((min(loop() for _ in range(3)), c))
print(min(times)[1])
PY
}

# paired_in FOLDER FLAGS ROUNDS PIN: per collective nccl-tests and the agent one right after
# the other, the order turning with each collective and round; with PIN=1 both under
# taskset on the CPU fastest_cpu names at the start of the round. The agent's documents of
# one round are merged into agent-sweep-rN.json for compare.py.
paired_in() {
  local d=$OUT/$1 flags=$2 rounds=$3 pin=$4 r c i who order cpu rc
  local pre=()
  mkdir -p "$d"
  banner "paired $1: $flags, $rounds rounds, $([ "$pin" = 1 ] && echo 'both tools on one CPU' || echo 'not pinned')"
  for r in $(seq 1 "$rounds"); do
    pre=()
    if [ "$pin" = 1 ]; then
      cpu=$(fastest_cpu)
      pre=(taskset -c "$cpu")
      echo "round $r: both tools on CPU $cpu"
    fi
    i=0
    for c in $COLLS; do
      i=$((i + 1))
      order="nt agent"
      [ $(((i + r) % 2)) = 1 ] && order="agent nt"
      for who in $order; do
        if [ "$who" = nt ]; then
          timeout 120 "${pre[@]}" "$REF/nccl-tests/build/${c}_perf" $flags -c 1 -g "$NGPU" \
            > "$d/nccltests-$c-r$r.txt" 2>&1
        else
          timeout 120 "${pre[@]}" "$AGENT" node-check --no-pairs --no-ddp --no-health \
            --collectives "$c" $flags --json "$d/agent-$c-r$r.json" > /dev/null 2> "$d/agent-$c-r$r.log"
        fi
        rc=$?
        [ $rc = 0 ] || echo "round $r $c $who rc=$rc"
      done
    done
    python3 - "$d" "$r" <<'PY'
import glob, json, sys
d, r = sys.argv[1], sys.argv[2]
merged = None
for path in sorted(glob.glob(f"{d}/agent-*-r{r}.json")):
    if "/agent-sweep-" in path:
        continue
    doc = json.load(open(path))
    if merged is None:
        merged = doc
    elif doc.get("nccl"):
        merged.setdefault("nccl", {}).setdefault("collectives", []).extend(doc["nccl"]["collectives"])
if merged is not None:
    json.dump(merged, open(f"{d}/agent-sweep-r{r}.json", "w"))
PY
  done
  banner "$1 ratios"
  python3 "$HERE/compare.py" "$d" | tee "$d/ratios.txt"
}

paired() {
  local flags=${PAIRED_FLAGS:-"-b 8 -e 1M -f 8 -w 5 -n 20"} rounds=${PAIRED_ROUNDS:-3}
  local pin
  for pin in ${PAIRED_PIN:-1 0}; do
    if [ "$pin" = 1 ]; then paired_in paired-pinned "$flags" "$rounds" 1
    else paired_in paired-free "$flags" "$rounds" 0; fi
  done
}

states() {
  local d=$OUT/states n=${STATES_RUNS:-6} v r c flags="-b 8 -e 4K -f 8 -w 5 -n 20"
  local pre=() envs=()
  mkdir -p "$d"
  for v in none conn1 conn32 noaslr eager group; do
    banner "states: $v, $n processes of each tool"
    pre=()
    envs=(GF_STATES="$v")
    case $v in
      conn1) envs+=(CUDA_DEVICE_MAX_CONNECTIONS=1) ;;
      conn32) envs+=(CUDA_DEVICE_MAX_CONNECTIONS=32) ;;
      noaslr) pre=(setarch "$(uname -m)" -R) ;;
      eager) envs+=(CUDA_MODULE_LOADING=EAGER) ;;
      group) envs+=(NCCL_LAUNCH_MODE=GROUP) ;;
    esac
    for r in $(seq 1 "$n"); do
      for c in all_reduce broadcast; do
        env "${envs[@]}" timeout 60 "${pre[@]}" "$REF/nccl-tests/build/${c}_perf" $flags -c 1 \
          -g "$NGPU" > "$d/$v-nt-$c-r$r.txt" 2>&1 || echo "$v nccl-tests $c r$r failed"
      done
      env "${envs[@]}" timeout 60 "${pre[@]}" "$AGENT" node-check --no-pairs --no-ddp --no-health \
        --collectives all_reduce,broadcast $flags --json "$d/$v-agent-r$r.json" > /dev/null \
        2> "$d/$v-agent-r$r.log" || echo "$v agent r$r failed"
    done
  done
  python3 - "$d" <<'PY' | tee "$d/states.txt"
import glob, json, statistics, sys
d = sys.argv[1]
def nt(path):
    t = []
    for line in open(path):
        f = line.split()
        if len(f) > 8 and f[0].isdigit():
            try:
                t.append(float(f[5]))
            except ValueError:
                pass
    return statistics.median(t) if t else None
names = {"allReduce": "all_reduce", "broadcast": "broadcast"}
print("median time over 8 B - 4 KiB per process (us), by setting, tool and collective")
for v in ["none", "conn1", "conn32", "noaslr", "eager", "group"]:
    for c in ["all_reduce", "broadcast"]:
        a = [nt(p) for p in sorted(glob.glob(f"{d}/{v}-nt-{c}-r*.txt"))]
        b = []
        for p in sorted(glob.glob(f"{d}/{v}-agent-r*.json")):
            doc = json.load(open(p))
            for col in (doc.get("nccl") or {}).get("collectives", []):
                if names.get(col["collective"]) == c:
                    b.append(statistics.median(r["timeUs"] for r in col["rows"]))
        fmt = lambda xs: " ".join("-" if x is None else f"{x:.1f}" for x in xs)
        print(f"{v:>7} {c:>10}  nccl-tests {fmt(a):<40} agent {fmt(b)}")
PY
}

copies() {
  banner "nvbandwidth copy-engine tests, 256 MiB"
  local tests="device_to_device_memcpy_write_ce device_to_device_memcpy_read_ce device_to_device_bidirectional_memcpy_write_ce host_to_device_memcpy_ce device_to_host_memcpy_ce"
  [ "$NGPU" -lt 2 ] && tests="host_to_device_memcpy_ce device_to_host_memcpy_ce"
  local t0; t0=$(now)
  timeout 300 "$REF/nvbandwidth/nvbandwidth" -j -b 256 -t $tests > "$OUT/nvbandwidth.json" 2> "$OUT/nvbandwidth.err"
  echo "nvbandwidth rc=$? wall $(since "$t0") s"; tail -3 "$OUT/nvbandwidth.err"
  banner "fabric-agent pair matrix, 256 MiB"
  t0=$(now)
  timeout 300 "$AGENT" node-check --no-nccl --no-ddp --no-health --pair-bytes 256M \
    --json "$OUT/agent-pairs.json" > /dev/null 2> "$OUT/agent-pairs.log"
  echo "agent rc=$? wall $(since "$t0") s"
}

check() { # name, env settings..., then -- and agent flags
  local name=$1; shift
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  banner "node-check $name: ${envs[*]:-} $*"
  local t0; t0=$(now)
  env "${envs[@]}" NCCL_NVLS_ENABLE=0 timeout 300 "$AGENT" node-check --no-ddp --verdict -f 8 "$@" \
    --json "$OUT/$name.json" > "$OUT/$name.verdict" 2> "$OUT/$name.log"
  local rc=$?
  echo "rc=$rc$([ $rc = 3 ] && echo ' (the verdict failed the node)') wall $(since "$t0") s"
  grep -E 'all_reduce +1073741824|pair [0-9] -> [0-9]' "$OUT/$name.log" | head -14
  grep -E '^# Verdict|^#  ' "$OUT/$name.verdict"
}

faults() {
  [ "$NGPU" -lt 2 ] && { echo "faults need 2 GPUs or more"; return; }
  check nchannels1 NCCL_MAX_NCHANNELS=1 --
  check p2p-disabled NCCL_P2P_DISABLE=1 --
  local a=1 b=$((NGPU - 1))
  [ "$NGPU" -lt 3 ] && { a=0; b=1; }
  banner "one-way copy load GPU $a -> GPU $b"
  python3 "$HERE/one_way_load.py" --src $a --dst $b --seconds 90 > "$OUT/one-way-load.log" 2>&1 &
  local pid=$!
  sleep 8
  check one-way-load -- --no-nccl
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  tail -2 "$OUT/one-way-load.log"
  for i in 1 2 3 4 5; do check clean$i --; done
}

summary() {
  banner "ratios"
  python3 "$HERE/compare.py" "$OUT" | tee "$OUT/ratios.txt"
}

banner "host"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv
nvidia-smi topo -m
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
echo "agent: $AGENT"; uname -r; nproc
# Which logical CPUs share a core: a launch thread beside a busy sibling is one suspect for
# the two small-message states.
lscpu 2>/dev/null | grep -E "^(Model name|Thread|Core|Socket|NUMA node)" || true
cat /sys/devices/system/cpu/cpu{0,8}/topology/thread_siblings_list 2>/dev/null | paste -sd" " || true
for stage in "${@:-all}"; do
  case $stage in
    build) build ;;
    sweep) sweep ;;
    steady) steady ;;
    graph) graph ;;
    paired) paired ;;
    states) states ;;
    copies) copies ;;
    faults) faults ;;
    summary) summary ;;
    all) build; sweep; copies; faults; summary ;;
    latency) latency ;;
    clocks) clocks ;;
    large) large ;;
    point) point ;;
    layout) layout ;;
    *) echo "usage: $0 build|sweep|steady|graph|paired|states|copies|faults|summary|all|latency|clocks|large|point|layout ..."; exit 2 ;;
  esac
done
