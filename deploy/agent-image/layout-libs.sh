#!/usr/bin/env bash
# Lays out NCCL and cuBLAS from the unpacked wheels in SRC as the agent image holds them:
# DEST/libnccl.so.2, DEST/libcublas.so.13, DEST/libcublasLt.so.13, with the unversioned names
# cudarc opens (libnccl.so, libcublas.so, libcublasLt.so) as symlinks. The image build and the
# on-device check (bench/agent-image-check.sh) run this same script.
#
#   layout-libs.sh SRC DEST
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 SRC DEST (SRC: a directory holding the unpacked nvidia/ wheels)" >&2; exit 2; }
src=$1 dest=$2
mkdir -p "$dest"
for lib in libnccl.so.2 libcublas.so.13 libcublasLt.so.13; do
    found=$(find -L "$src" -name "$lib" -type f 2>/dev/null | sort | head -n 1)
    if [ -z "$found" ]; then
        echo "layout-libs: $lib not found under $src (are the pinned wheels unpacked there?)" >&2
        exit 1
    fi
    cp -L "$found" "$dest/$lib"
    ln -sf "$lib" "$dest/${lib%.*}"
done
ls -l "$dest"
