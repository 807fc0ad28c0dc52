#!/usr/bin/env bash
# On a GPU host without a container engine: checks what can be checked of the agent image and
# the agent's verdict, and writes logs under $OUT (default ./agent-image-out).
#
#   1. driver >= MIN_DRIVER of deploy/agent-image/versions.env; the NCCL and cuBLAS wheels
#      installed on the host are the pinned versions;
#   2. the image's library directory, laid out from those wheels by the image's own script
#      (deploy/agent-image/layout-libs.sh), is the only library path the agent gets: it runs
#      `node-check --quick` with an empty environment, as the image's non-root user (uid 65532),
#      and LD_DEBUG shows where NCCL and cuBLAS were loaded from;
#   3. `node-check --verdict` passes the clean GPU (exit 0), fails it while
#      `fabric-agent inject host-load` shares its host link (exit 3, findings printed), and
#      passes it again once the load is gone.
#
# The agent binary: $AGENT, else .device/fabric-agent. NCCL_NVLS_ENABLE=0 throughout.
set -u
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/agent-image-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/check.log") 2>&1
AGENT=$(realpath "${AGENT:-.device/fabric-agent}")
[ -x "$AGENT" ] || { echo "no agent binary at $AGENT"; exit 1; }
. deploy/agent-image/versions.env
banner() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
status=0

banner "driver and pinned libraries"
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)
nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv
echo "driver $driver, image needs >= $MIN_DRIVER: $([ "${driver%%.*}" -ge "$MIN_DRIVER" ] && echo ok || { status=1; echo TOO OLD; })"
for pin in "$NCCL_WHEEL==$NCCL_VERSION" "$CUBLAS_WHEEL==$CUBLAS_VERSION"; do
    name=${pin%%==*} want=${pin##*==}
    have=$(python3 -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || echo missing)
    echo "$name: pinned $want, installed $have: $([ "$have" = "$want" ] && echo same || echo DIFFERENT)"
    [ "$have" = "$want" ] || status=1
done

banner "the image's library directory, laid out by deploy/agent-image/layout-libs.sh"
ROOT=/tmp/agent-image-root
rm -rf "$ROOT"; mkdir -p "$ROOT/opt/gpufabric"
SITE=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))')
deploy/agent-image/layout-libs.sh "$SITE" "$ROOT/opt/gpufabric/lib" || status=1
cp "$AGENT" "$ROOT/fabric-agent"; chmod 755 "$ROOT" "$ROOT/opt" "$ROOT/opt/gpufabric" "$ROOT/opt/gpufabric/lib" "$ROOT/fabric-agent"

banner "node-check --quick with only the image's libraries, as uid 65532"
as_user=(setpriv --reuid=65532 --regid=65532 --clear-groups)
command -v setpriv >/dev/null || { echo "setpriv missing: running as $(id -un)"; as_user=(); }
# The user of the image writes only where the pod lets it: a scratch directory here.
mkdir -p "$ROOT/scratch"; chmod 1777 "$ROOT/scratch"
env -i PATH=/usr/bin:/bin HOME=/tmp LD_LIBRARY_PATH="$ROOT/opt/gpufabric/lib" NCCL_NVLS_ENABLE=0 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility LD_DEBUG=libs LD_DEBUG_OUTPUT="$ROOT/scratch/ld" \
    "${as_user[@]}" "$ROOT/fabric-agent" node-check --quick --json "$ROOT/scratch/image-quick.json" \
    > "$OUT/image-quick.txt" 2>&1
rc=$?
grep -E "^# (Out of bounds|Check finished)|error" "$OUT/image-quick.txt"
echo "node-check --quick as uid $([ ${#as_user[@]} -gt 0 ] && echo 65532 || id -u): exit $rc"
[ $rc -eq 0 ] || status=1
echo "libraries the agent loaded (LD_DEBUG):"
cat "$ROOT"/scratch/ld.* "$OUT/image-quick.txt" 2>/dev/null \
    | grep -E "calling init: .*lib(nccl|cublas|cublasLt|cuda|nvidia-ml)\.so" | sed 's/^ *[0-9]*: *//' | sort -u
grep -v "^ *[0-9]*:" "$OUT/image-quick.txt" > "$OUT/image-quick.log"; rm -f "$OUT/image-quick.txt"

banner "node-check --verdict on the clean GPU"
"$AGENT" node-check --verdict --json "/tmp/verdict-clean.json" > "$OUT/verdict-clean.txt" 2>&1
rc=$?; sed -n "/^memcpy CE CPU/,/^# Check finished/p;/^# Verdict/,\$p" "$OUT/verdict-clean.txt" | grep -v "^{"; echo "verdict clean: exit $rc (want 0)"
[ $rc -eq 0 ] || status=1

banner "node-check --verdict while fabric-agent inject host-load shares GPU 0's host link"
"$AGENT" inject host-load --gpu 0 --streams 3 --seconds 120 > "$OUT/inject.txt" 2>&1 &
inj=$!
sleep 5
"$AGENT" node-check --verdict --json "/tmp/verdict-loaded.json" > "$OUT/verdict-loaded.txt" 2>&1
rc=$?
kill "$inj" 2>/dev/null; wait "$inj" 2>/dev/null
sed -n "/^memcpy CE CPU/,/^# Check finished/p;/^# Verdict/,\$p" "$OUT/verdict-loaded.txt" | grep -v "^{"; cat "$OUT/inject.txt"
echo "verdict loaded: exit $rc (want 3)"
[ $rc -eq 3 ] || status=1

banner "node-check --verdict once the load is gone"
"$AGENT" node-check --verdict --json "/tmp/verdict-after.json" > "$OUT/verdict-after.txt" 2>&1
rc=$?; sed -n "/^memcpy CE CPU/,/^# Check finished/p;/^# Verdict/,\$p" "$OUT/verdict-after.txt" | grep -v "^{"; echo "verdict after: exit $rc (want 0)"
[ $rc -eq 0 ] || status=1

banner "done: $([ $status -eq 0 ] && echo all checks passed || echo SOME CHECKS FAILED)"
exit $status
