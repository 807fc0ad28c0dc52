#!/usr/bin/env bash
# Assembles the fabric-agent image on a GPU host from the kit that `deploy/images/build.sh
# --kit DIR` wrote, with that host's own NCCL and cuBLAS (the pinned wheels, installed with
# pip): every other layer and every setting of the image as build.sh packs it. For hosts the
# whole image cannot be carried to (its two wheel layers are most of its size).
#
#   deploy/images/assemble-agent.sh KIT OUT [SITE_PACKAGES]
#
#   KIT            agent-kit.tar.xz from build.sh --kit
#   OUT            the OCI archive to write (import it with ctr -n k8s.io images import OUT)
#   SITE_PACKAGES  where the nvidia-nccl and nvidia-cublas wheels are installed (default: the
#                  folder above python3's `nvidia` package)
#
# Refuses a host whose wheels are not the versions deploy/agent-image/versions.env pins.
set -euo pipefail
cd "$(dirname "$0")/../.."
die() { echo "assemble-agent.sh: $*" >&2; exit 1; }
[ $# -ge 2 ] || { sed -n '2,/^set -/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
kit=$(realpath "$1") out=$2
sp=${3:-$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null)} ||
    die "no site-packages with an nvidia package; name it as the third argument"
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
xz -dc "$kit" | tar -C "$w" -xf - || die "cannot unpack $kit"
# shellcheck source=/dev/null
. "$w/versions.env"
for pin in "$NCCL_WHEEL==$NCCL_VERSION" "$CUBLAS_WHEEL==$CUBLAS_VERSION"; do
    name=${pin%%==*} want=${pin##*==}
    have=$(python3 -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || echo missing)
    [ "$have" = "$want" ] || die "$name: the image pins $want, this host has $have"
done
deploy/agent-image/layout-libs.sh "$sp" "$w/libs" >/dev/null
for part in nccl:3-nccl:nvidia_nccl:"$NCCL_WHEEL" cublas:4-cublas:nvidia_cublas:"$CUBLAS_WHEEL"; do
    IFS=: read -r lib layer dist wheel <<<"$part"
    mkdir -p "$w/layers/$layer/opt/gpufabric/lib" "$w/layers/$layer/opt/gpufabric/licenses"
    mv "$w"/libs/lib"$lib"* "$w/layers/$layer/opt/gpufabric/lib/"
    licence=$(find "$sp" -maxdepth 3 -path "*/${dist}*.dist-info/*" -iname 'License.txt' | sort | head -1)
    [ -n "$licence" ] || die "no License.txt in $sp/${dist}*.dist-info"
    cp "$licence" "$w/layers/$layer/opt/gpufabric/licenses/$wheel.txt"
done
[ -z "$(ls -A "$w/libs")" ] || die "layout-libs.sh laid out more than NCCL and cuBLAS: $(ls "$w/libs")"
mapfile -t args < <(sed "s|^@OUT@\$|$out|; s|^@SUMMARY@\$|$w/summary.json|" "$w/oci-args")
layers=()
for d in "$w"/layers/*; do layers+=(--layer "$d"); done
SOURCE_DATE_EPOCH=$(cat "$w/epoch") python3 deploy/images/oci.py "${layers[@]}" "${args[@]}" >&2 ||
    die "oci.py failed"
python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); print(s["ref"], s["digest"])' "$w/summary.json"
