#!/usr/bin/env bash
# Build the binaries of a real Kubernetes node (kubelet, kube-proxy) and kube-scheduler
# from Go modules, once, into a cache dir, beside Debian's busybox-static (the node's
# pause and test images are made of it), containerd 1.7 (CDI, for the node's DRA mode) and
# the GPU DRA kubelet plugin fixture. The control plane comes from build.sh.
#
#   NODE_BIN=$(tests/cluster/build-node.sh)          # build if needed, print bin dir
#   tests/cluster/build-node.sh --print-bin-dir      # print bin dir, build nothing
#
# Progress goes to stderr; the bin directory is the ONLY line on stdout.
# See tests/cluster/README.md ("A real node").
set -euo pipefail

usage() {
	cat <<'EOF'
Usage: tests/cluster/build-node.sh [--print-bin-dir] [--help]

Builds kubelet, kube-proxy and kube-scheduler from the Go wrapper module in
tests/cluster/node, containerd 1.7 from tests/cluster/containerd and the GPU
DRA kubelet plugin from tests/cluster/draplugin (only the Go module proxy is
used), fetches busybox from
Debian's busybox-static package (apt-get download, unpacked with dpkg-deb -x:
nothing is installed) and prints the directory holding them as the only line
on stdout:

    export GPUFABRIC_NODE_BIN=$(tests/cluster/build-node.sh)

The binaries are cached in
    ${GPUFABRIC_CACHE:-$HOME/.cache/gpufabric}/node/<key>/bin/
where <key> hashes the k8s version, `go version`, the wrappers' go.mod and
go.sum and the DRA plugin's sources (plus a scheme number bumped when build flags change). A warm cache
builds nothing; a binary already in the key's directory is not built again. Built after tests/cluster/build.sh (which leaves most packages
in the Go build cache) it takes a few minutes; see README.md for the times.

Options:
  --print-bin-dir  print the bin directory for the current key and exit
                   (does not build; the directory may not exist yet)
  --help           show this help

Environment:
  GPUFABRIC_CACHE  cache root (default: $HOME/.cache/gpufabric)
  GOMODCACHE, GOCACHE, GOPROXY are honoured as usual. GOFLAGS is overridden
  (-mod=readonly -buildvcs=false), GOTOOLCHAIN=local, CGO_ENABLED=0, GOWORK=off.
EOF
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_tag=node
binaries=(kubelet kube-proxy kube-scheduler busybox containerd gpu-dra-plugin)
go_binaries=(kubelet kube-proxy kube-scheduler)
# shellcheck source=tests/build-cache.sh
source "$here/../build-cache.sh"
cache_parse_args usage "$@"

# Bump when the build flags below change, so old cached binaries are not reused.
BUILD_SCHEME=1

node_dir="$here/node"
containerd_dir="$here/containerd"
draplugin_dir="$here/draplugin"

command -v go >/dev/null 2>&1 || die "go not found in PATH"

# As in build.sh: never download a toolchain, never rewrite go.mod/go.sum, no go.work,
# no cgo (upstream builds these three statically too).
export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -buildvcs=false"
export GOWORK=off
export CGO_ENABLED=0

k8s_version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3; exit }' "$node_dir/go.mod")"
[[ -n "$k8s_version" ]] || die "cannot read the k8s.io/kubernetes version from $node_dir/go.mod"
go_version="$(go version)"

key="$(
	{
		echo "scheme=$BUILD_SCHEME"
		echo "k8s=$k8s_version"
		echo "go=$go_version"
		for f in "$node_dir/go.mod" "$node_dir/go.sum"; do
			echo "node/$(basename "$f")=$(sha256sum <"$f" | cut -d' ' -f1)"
		done
		for f in "$containerd_dir/go.mod" "$containerd_dir/go.sum" "$draplugin_dir"/go.* "$draplugin_dir"/*.go; do
			echo "${f#"$here"/}=$(sha256sum <"$f" | cut -d' ' -f1)"
		done
	} | sha256sum | cut -c1-16
)"
cache_open node "$key"
log "cold cache: building kubelet, kube-proxy, kube-scheduler $k8s_version with $go_version"
log "into $bin_dir (key $key)"

start=$SECONDS

# The same version stamps as build.sh, so `kubelet --version` and the Node's
# status.nodeInfo.kubeletVersion say v1.33.13.
build_date="$(cd "$node_dir" && go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)"
[[ -n "$build_date" ]] || build_date="1970-01-01T00:00:00Z"
k8s_ver_noV="${k8s_version#v}"
k8s_major="${k8s_ver_noV%%.*}"
k8s_minor="${k8s_ver_noV#*.}"
k8s_minor="${k8s_minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$k8s_version"
	ldflags+=" -X $pkg.gitMajor=$k8s_major"
	ldflags+=" -X $pkg.gitMinor=$k8s_minor"
	ldflags+=" -X $pkg.gitCommit=gomod-k8s.io/kubernetes@$k8s_version"
	ldflags+=" -X $pkg.gitTreeState=clean"
	ldflags+=" -X $pkg.buildDate=$build_date"
done

n=0
for name in "${go_binaries[@]}"; do
	t0=$SECONDS
	n=$((n + 1))
	# Only a finished build is renamed into place, so a binary here is whole.
	if [[ -x "$bin_dir/$name" ]]; then
		log "$name already built"
		continue
	fi
	log "building $name (${n}/${#go_binaries[@]})... (elapsed $((SECONDS - start))s)"
	(cd "$node_dir" && go build -trimpath -ldflags="$ldflags" -o "$bin_dir/.$name.tmp" "k8s.io/kubernetes/cmd/$name") >&2 ||
		die "building $name (k8s.io/kubernetes/cmd/$name in $node_dir) failed"
	mv -f "$bin_dir/.$name.tmp" "$bin_dir/$name"
	log "built $name in $((SECONDS - t0))s (elapsed $((SECONDS - start))s)"
done

# containerd 1.7: the CDI the DRA plugin's claims need (Debian 12's 1.6 has none). The
# snapshotters that need cgo are left out; overlayfs, native and the CRI plugin are in.
containerd_version="$(awk '$1 == "require" && $2 == "github.com/containerd/containerd" { print $3; exit }' "$containerd_dir/go.mod")"
if [[ -x "$bin_dir/containerd" ]]; then
	log "containerd already built"
else
	t0=$SECONDS
	log "building containerd $containerd_version... (elapsed $((SECONDS - start))s)"
	(cd "$containerd_dir" && go build -trimpath -tags "no_btrfs no_devmapper no_zfs no_aufs" \
		-ldflags "-s -w -X github.com/containerd/containerd/version.Version=$containerd_version" \
		-o "$bin_dir/.containerd.tmp" github.com/containerd/containerd/cmd/containerd) >&2 ||
		die "building containerd (github.com/containerd/containerd/cmd/containerd in $containerd_dir) failed"
	mv -f "$bin_dir/.containerd.tmp" "$bin_dir/containerd"
	log "built containerd in $((SECONDS - t0))s (elapsed $((SECONDS - start))s)"
fi

# The GPU DRA kubelet plugin fixture (tests/cluster/draplugin/main.go).
if [[ -x "$bin_dir/gpu-dra-plugin" ]]; then
	log "gpu-dra-plugin already built"
else
	t0=$SECONDS
	log "building gpu-dra-plugin... (elapsed $((SECONDS - start))s)"
	(cd "$draplugin_dir" && go build -trimpath -ldflags "-s -w" -o "$bin_dir/.gpu-dra-plugin.tmp" .) >&2 ||
		die "building the DRA plugin in $draplugin_dir failed"
	mv -f "$bin_dir/.gpu-dra-plugin.tmp" "$bin_dir/gpu-dra-plugin"
	log "built gpu-dra-plugin in $((SECONDS - t0))s (elapsed $((SECONDS - start))s)"
fi

# busybox: sh, sleep, httpd, wget, ... in one static binary, for the pause and test images.
command -v apt-get >/dev/null 2>&1 || die "apt-get not found: busybox comes from Debian's busybox-static package"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log "downloading Debian's busybox-static package"
(cd "$work" && apt-get download busybox-static) >&2 || die "apt-get download busybox-static failed"
deb="$(ls "$work"/busybox-static_*.deb)"
dpkg-deb -x "$deb" "$work/x" || die "unpacking $deb failed"
busybox_version="$(dpkg-deb -f "$deb" Version)"
cp "$work/x/bin/busybox" "$bin_dir/.busybox.tmp"
mv -f "$bin_dir/.busybox.tmp" "$bin_dir/busybox"
log "busybox from busybox-static $busybox_version"

{
	echo "KUBERNETES_VERSION=$k8s_version"
	echo "BUSYBOX_STATIC_VERSION=$busybox_version"
	echo "CONTAINERD_VERSION=$containerd_version"
	echo "GO_VERSION=\"$go_version\""
} | cache_close "$start"
