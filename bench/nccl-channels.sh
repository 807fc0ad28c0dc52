#!/usr/bin/env bash
# Compares how NCCL sets up the DDP probe's communicators (one process, all GPUs) and
# PyTorch DDP's (one process per GPU): channels and CTAs from NCCL's INFO log, plus the
# probe with NCCL_MAX_CTAS limits. Writes $OUT/nccl-channels.txt.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-check-out}; mkdir -p "$OUT"; R=$OUT/nccl-channels.txt
. "$(dirname "$0")/lib.sh"
wheel_libs
rm -f /tmp/ncclp.* /tmp/ncclt.*
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,ENV NCCL_DEBUG_FILE=/tmp/ncclp.%p .device/fabric-agent node-check --no-nccl --no-pairs --no-health --ddp-gpu-counts 4 2>&1 | grep "ddp 4" > $R
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,ENV NCCL_DEBUG_FILE=/tmp/ncclt.%p python3 bench/ddp_reference.py --counts 4 >> $R 2>&1
for f in ncclp ncclt; do
  echo "== $f" >> $R
  cat /tmp/$f.* | grep -iE "nchannels|channels|CTA|comm 0x.* rank 0 nRanks|NCCL_" | sed 's/^[^ ]* //' | sort | uniq -c | sort -rn | head -25 >> $R
done
for c in 8 16 24; do
  echo "== probe NCCL_MAX_CTAS=$c" >> $R
  NCCL_MAX_CTAS=$c .device/fabric-agent node-check --no-nccl --no-pairs --no-health --ddp-gpu-counts 1,4 2>&1 | grep "ddp [14] GPU" >> $R
done
cat $R
