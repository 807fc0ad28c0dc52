#!/usr/bin/env bash
# The multi-node NCCL sweep beside nccl-tests, the same ranks on the same bed: N emulated nodes
# on one GPU host (one network namespace each, joined by a bridge, NCCL over its socket
# transport on veth, netns-nodes.sh), one node's link shaped. fabric-agent nccl-nodes sweeps
# all_reduce, all_gather, reduce_scatter and alltoall over 2, 4, ... N of them in one run;
# nccl-tests (built here from its source with MPI, Open MPI from Debian's packages) runs each
# collective at each node count as its own MPI job of that many ranks, one rank per namespace,
# with the same sizes, iterations and NCCL settings. ROUNDS rounds, the two tools' order
# alternating. Then, per node count, collective and large size: the agent's busbw beside
# nccl-tests' median and its own spread (min..max over the rounds), and the small size's time.
#
#   bench/nccl-nodes-compare.sh
#   N=4 ROUNDS=3 SHAPE_NODE=3 SHAPE_RATE=5gbit MAX=64M LARGE=16M bench/nccl-nodes-compare.sh
#
# With fewer GPUs than nodes, node i uses GPU i mod the GPU count: ranks sharing a GPU are
# distinct hosts to NCCL (NCCL_HOSTID) and the agent runs with --shared-gpus; nccl-tests'
# ranks pick the same GPU through NCCL_TESTS_DEVICE (its own device choice counts ranks per
# hostname, which every namespace shares).
#
# Open MPI's launcher runs inside node 0's namespace and each rank enters its own: the ranks'
# PMIx and TCP traffic then crosses the bridge as NCCL's does, between namespaces only (on the
# development machine a namespace's TCP connection to an address on the host's bridge timed
# out; between two namespaces it connected).
#
# Needs, under .device (carried, never committed):
#   nccl-compare/fabric-agent.xz   a release build of the agent
#   nccl-compare/nccl-tests.tar.gz nccl-tests' source (git archive of NVIDIA/nccl-tests)
#   nccl-compare/mpi/*.deb         openmpi-bin libopenmpi3 libopenmpi-dev openmpi-common
#                                  libhwloc15 libevent-* libpmix2 libfabric1 libucx0 libibverbs1
#                                  librdmacm1 libnl-3-200 libnl-route-3-200 libpsm2-2
#                                  libpsm-infinipath1 libltdl7 libnuma1 libmunge2 libpciaccess0
#   netns-nodes.sh, debs/          the emulated nodes and iproute2 (see netns-nodes.sh)
# and on the host: nvcc, PyTorch's NCCL wheel, root. Everything lands in $OUT (default
# ./nccl-nodes-compare-out): the logs of every run, the agent's documents, compare.txt, and all
# of them again in all.tar.xz. A device call brings back only a few files, so the runs' logs and
# documents are written under /tmp/gf-cmp-logs and $OUT holds compare.log, compare.txt and
# all.tar.xz (every log and document, packed again after each round so that a run cut short
# still brings back the rounds it finished). REF_COUNTS limits nccl-tests to some node counts
# (default all of the agent's), e.g. REF_COUNTS=4 where two nodes were compared before.
# BUDGET (seconds from the script's start, default 570 for a device call of 600) bounds the
# rounds: a round starts only when the longest so far would still end within it, so a call
# ends with its comparison written over the rounds it finished rather than cut mid-round.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
N=${N:-4}; ROUNDS=${ROUNDS:-3}; MAX=${MAX:-64M}; LARGE=${LARGE:-16M}; BUDGET=${BUDGET:-570}
SHAPE_NODE=${SHAPE_NODE:-$((N - 1))}; SHAPE_RATE=${SHAPE_RATE:-5gbit}
WARMUP=5; ITERS=20; FACTOR=4; MIN=1K
DEV=$PWD/.device/nccl-compare
OUT=${OUT:-$PWD/nccl-nodes-compare-out}
LOGS=/tmp/gf-cmp-logs
rm -rf "$LOGS"; mkdir -p "$OUT" "$LOGS"
exec > >(tee -a "$OUT/compare.log") 2>&1
. "$(dirname "$0")/lib.sh"
netns_setup
banner() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
COLLS="all_reduce all_gather reduce_scatter alltoall"
NGPU=$(nvidia-smi -L | wc -l)
NODES=$(seq -s, -f "node%g" 0 $((N - 1)))
COUNTS=$(python3 -c "
n=$N; c=[]; k=2
while k<n: c.append(k); k*=2
c.append(n); print(' '.join(map(str,c)))")
REF_COUNTS=${REF_COUNTS:-$COUNTS}
A0=192.0.2.10
REF_FAILS=0
gpu_of() { echo $(($1 % NGPU)); }

# The agent, Open MPI and nccl-tests, unpacked and built under /tmp.
setup() {
  banner "setup: $N emulated nodes on $NGPU GPU(s), node counts $COUNTS (nccl-tests at $REF_COUNTS), sizes $MIN..$MAX x$FACTOR"
  AGENT=/tmp/gf-cmp-agent
  xz -dc "$DEV/fabric-agent.xz" > $AGENT && chmod +x $AGENT
  MPI=/tmp/gf-mpi
  rm -rf $MPI; mkdir -p $MPI
  for f in "$DEV"/mpi/*.deb; do dpkg-deb -x "$f" $MPI; done
  local L=$MPI/usr/lib/x86_64-linux-gnu
  export OPAL_PREFIX=$MPI/usr PATH=$MPI/usr/bin:$PATH
  export LD_LIBRARY_PATH=$L/openmpi/lib:$L:$MPI/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
  # The launcher's PMIx server listens on node 0's veth, where the other namespaces reach it.
  export PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=eth0
  export PMIX_MCA_pcompress='^zlib' OMPI_MCA_mca_base_component_show_load_errors=0
  # nccl-tests builds against the wheel's nccl.h and libnccl.so.2 (compare.sh's home).
  NCCL_HOME=/tmp/gf-nccl
  local nccl_dir
  nccl_dir=$(dirname "$(find "$SP/nvidia" -path '*nccl*' -name 'libnccl.so.2' | head -1)")
  mkdir -p $NCCL_HOME/lib
  ln -sfn "$nccl_dir/../include" $NCCL_HOME/include
  ln -sf "$nccl_dir/libnccl.so.2" $NCCL_HOME/lib/libnccl.so
  ln -sf "$nccl_dir/libnccl.so.2" $NCCL_HOME/lib/libnccl.so.2
  REF=/tmp/gf-nccl-tests
  rm -rf $REF; mkdir -p $REF
  tar -xzf "$DEV/nccl-tests.tar.gz" -C $REF
  local cc t0=$SECONDS
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  ( cd $REF && make -j16 MPI=1 MPI_HOME=$L/openmpi CUDA_HOME=/usr/local/cuda \
      NCCL_HOME=$NCCL_HOME NVCC_GENCODE="-gencode=arch=compute_$cc,code=sm_$cc" ) \
    > "$LOGS/build-nccl-tests.log" 2>&1
  echo "nccl-tests (MPI) built rc=$? in $((SECONDS - t0)) s: $(ls $REF/build/*_perf 2>/dev/null | wc -l) binaries"
  tail -2 "$LOGS/build-nccl-tests.log"
  "$AGENT" --version
  orterun --version | head -1
  python3 -c 'import torch; print("nccl (wheel)", torch.cuda.nccl.version())' 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  # One rank of an MPI job: into its own namespace, on its GPU.
  cat > /tmp/gf-cmp-rank.sh <<EOF
#!/bin/sh
i=\$OMPI_COMM_WORLD_RANK
GPUS_OF_NODE=\$((i % $NGPU)) exec $NETNS exec \$i env NCCL_TESTS_DEVICE=0 "\$@"
EOF
  chmod +x /tmp/gf-cmp-rank.sh
}

# agent_round R: one run of every rank of the sweep.
agent_round() {
  local r=$1 pids=() codes="" t0=$SECONDS
  for i in $(seq 0 $((N - 1))); do
    env GPUS_OF_NODE=$(gpu_of $i) $NETNS exec $i "$AGENT" nccl-nodes --backend cuda \
      --shared-gpus --nodes "$NODES" --rank $i --rendezvous $A0:29400 --group "cmp/r$r" \
      --secret "$SECRET" -b $MIN -e $MAX -f $FACTOR --large-bytes $LARGE -w $WARMUP \
      -n $ITERS --rendezvous-timeout 60 --timeout 120 --json "$LOGS/agent-r$r-rank$i.json" \
      > "$LOGS/agent-r$r-rank$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; codes="$codes $?"; done
  echo "agent round $r: exit codes$codes, $((SECONDS - t0)) s"
}

# nccl_tests_round R: every collective at every node count, an MPI job each.
nccl_tests_round() {
  local r=$1 k c rc t0=$SECONDS
  for k in $REF_COUNTS; do
    for c in $COLLS; do
      if [ "$REF_FAILS" -ge 2 ]; then echo "nccl-tests: skipped after two failed jobs"; return; fi
      GPUS_OF_NODE=0 timeout 90 $NETNS exec 0 env PATH="$PATH" orterun --allow-run-as-root \
        --oversubscribe -np $k --bind-to none --mca pml ob1 --mca btl self,tcp \
        --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
        /tmp/gf-cmp-rank.sh $REF/build/${c}_perf -b $MIN -e $MAX -f $FACTOR -w $WARMUP \
        -n $ITERS -c 1 -g 1 > "$LOGS/nccl-tests-r$r-n$k-$c.log" 2>&1
      rc=$?
      if [ $rc -ne 0 ]; then
        REF_FAILS=$((REF_FAILS + 1))
        echo "nccl-tests $c n=$k round $r: rc=$rc"; tail -5 "$LOGS/nccl-tests-r$r-n$k-$c.log"
      fi
    done
  done
  echo "nccl-tests round $r: $((SECONDS - t0)) s"
}

# pack: every log and document so far into $OUT/all.tar.xz.
pack() {
  tar -C "$LOGS" -cJf /tmp/gf-cmp-all.tar.xz . && mv /tmp/gf-cmp-all.tar.xz "$OUT/all.tar.xz"
}

setup
banner "namespaces up: $N nodes; node $SHAPE_NODE's link shaped to $SHAPE_RATE"
netns_fresh $N || exit 1
$NETNS shape $SHAPE_NODE $SHAPE_RATE
DONE=0; LONGEST=0
for r in $(seq 1 $ROUNDS); do
  if [ $((SECONDS + LONGEST + 15)) -gt "$BUDGET" ]; then
    echo "stopping after $DONE of $ROUNDS rounds: the longest round took $LONGEST s, $((BUDGET - SECONDS)) s of BUDGET=$BUDGET are left"
    break
  fi
  banner "round $r"
  t_round=$SECONDS
  if [ $((r % 2)) -eq 1 ]; then agent_round $r; nccl_tests_round $r
  else nccl_tests_round $r; agent_round $r; fi
  pack
  DONE=$r; LONGEST=$(( SECONDS - t_round > LONGEST ? SECONDS - t_round : LONGEST ))
done
$NETNS down
banner "compare ($DONE rounds)"
python3 "$(dirname "$0")/nccl_nodes_compare.py" "$LOGS" "$DONE" "$LARGE" | tee "$OUT/compare.txt"
cp "$OUT/compare.txt" "$LOGS/"
pack
