# Set-up shared by the bench scripts on a GPU host; sourced, never run:
#   . "$(dirname "$0")/lib.sh"
# NVLink multicast (NVLS) stays off everywhere: shared hosts can be put out of service by it.
# wheel_libs: NCCL and cuBLAS come from PyTorch's wheels (nvidia-*), which ship versioned
# names (libnccl.so.2, libcublas.so.13); cudarc opens the unversioned ones. Links them into
# $LIBS (default /tmp/fabric-libs) and puts it and the wheels' folders on LD_LIBRARY_PATH.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LIBS=${LIBS:-/tmp/fabric-libs}
SP=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null)

wheel_libs() {
  local pat f
  mkdir -p "$LIBS"
  for pat in libnccl.so libcublas.so libcublasLt.so; do
    f=$(find "$SP/nvidia" -name "$pat.[0-9]*" 2>/dev/null | sort | head -1)
    if [ -n "$f" ]; then
      ln -sf "$f" "$LIBS/$pat"
      LD_LIBRARY_PATH=$(dirname "$f"):${LD_LIBRARY_PATH:-}
    fi
  done
  export LD_LIBRARY_PATH=$LIBS:${LD_LIBRARY_PATH:-}
}

# netns_setup: what the emulated-node scripts share (ddp-nodes-check.sh, node-pair-check.sh):
# the agent, netns-nodes.sh and its Debian packages from .device, the wheels' libraries, and a
# run-scoped rendezvous secret in $SECRET.
netns_setup() {
  AGENT=$PWD/.device/fabric-agent
  NETNS="bash $PWD/.device/netns-nodes.sh"
  export DEBS=$PWD/.device/debs
  wheel_libs
  SECRET=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
}

# netns_fresh N: the emulated nodes taken down and brought up again, N of them. Deleting a
# namespace frees its veth ends asynchronously, so an `up` right after `down` can meet the
# old names ("RTNETLINK answers: File exists") and stop half-way, which loses the run; the
# pair retried until `up` takes (at most 20 times, half a second apart).
netns_fresh() {
  local n=$1 t
  for t in $(seq 1 20); do
    $NETNS down >/dev/null 2>&1
    if $NETNS up "$n" 2>/dev/null; then
      [ "$t" -gt 1 ] && echo "netns: up took $t tries"
      return 0
    fi
    sleep 0.5
  done
  echo "netns: $n emulated nodes could not be brought up"
  return 1
}
