#!/usr/bin/env bash
# Build a real local Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager, kubectl) from Go modules, once, into a cache dir.
#
#   BIN=$(tests/cluster/build.sh)          # build if needed, print bin dir
#   tests/cluster/build.sh --print-bin-dir # print bin dir, build nothing
#
# Progress goes to stderr; the bin directory is the ONLY line on stdout.
# See tests/cluster/README.md.
set -euo pipefail

usage() {
	cat <<'EOF'
Usage: tests/cluster/build.sh [--print-bin-dir] [--help]

Builds etcd, kube-apiserver, kube-controller-manager and kubectl from the Go
wrapper modules in tests/cluster/etcd and tests/cluster/k8s (no Docker, no
GitHub downloads: only the Go module proxy is used) and prints the directory
holding them as the only line on stdout:

    BIN=$(tests/cluster/build.sh)

The binaries are cached in
    ${GPUFABRIC_CACHE:-$HOME/.cache/gpufabric}/cluster/<key>/bin/
where <key> hashes the k8s and etcd versions, `go version`, and both wrappers'
go.mod and go.sum (plus a scheme number bumped when build flags change).
A warm cache (stamp file present) builds nothing (~0.1 s). A cold build takes
~11 minutes on 2 cores (see README.md); progress is printed on stderr.

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
cache_tag=cluster
binaries=(etcd kube-apiserver kube-controller-manager kubectl)
# shellcheck source=tests/build-cache.sh
source "$here/../build-cache.sh"
cache_parse_args usage "$@"

# Bump when the build flags below change, so old cached binaries are not reused.
BUILD_SCHEME=1

k8s_dir="$here/k8s"
etcd_dir="$here/etcd"

command -v go >/dev/null 2>&1 || die "go not found in PATH"

# Never download a toolchain, never let a caller's GOFLAGS (e.g. -mod=mod)
# rewrite go.mod/go.sum, never pick up a go.work, never use cgo.
export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -buildvcs=false"
export GOWORK=off
export CGO_ENABLED=0

# Versions come from the wrappers' go.mod (single source of truth).
mod_version() { # <go.mod> <module path>
	awk -v m="$2" '
		$1 == "require" && $2 == m { print $3; exit }
		$1 == m && $2 ~ /^v/ { print $2; exit }
	' "$1"
}
k8s_version="$(mod_version "$k8s_dir/go.mod" k8s.io/kubernetes)"
etcd_version="$(mod_version "$etcd_dir/go.mod" go.etcd.io/etcd/server/v3)"
[[ -n "$k8s_version" ]] || die "cannot read k8s.io/kubernetes version from $k8s_dir/go.mod"
[[ -n "$etcd_version" ]] || die "cannot read go.etcd.io/etcd/server/v3 version from $etcd_dir/go.mod"
go_version="$(go version)"

key="$(
	{
		echo "scheme=$BUILD_SCHEME"
		echo "k8s=$k8s_version"
		echo "etcd=$etcd_version"
		echo "go=$go_version"
		for f in "$k8s_dir/go.mod" "$k8s_dir/go.sum" "$etcd_dir/go.mod" "$etcd_dir/go.sum"; do
			echo "$(basename "$(dirname "$f")")/$(basename "$f")=$(sha256sum <"$f" | cut -d' ' -f1)"
		done
	} | sha256sum | cut -c1-16
)"
cache_open cluster "$key"
log "cold cache: building k8s $k8s_version + etcd $etcd_version with $go_version"
log "into $bin_dir (key $key); a cold build takes ~11 min on 2 cores"

start=$SECONDS

# Commit date of the k8s.io/kubernetes module version (from the proxy .info),
# so buildDate is reproducible. This also downloads/verifies the module.
build_date="$(cd "$k8s_dir" && go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)"
[[ -n "$build_date" ]] || build_date="1970-01-01T00:00:00Z"

k8s_ver_noV="${k8s_version#v}"
k8s_major="${k8s_ver_noV%%.*}"
k8s_minor="${k8s_ver_noV#*.}"
k8s_minor="${k8s_minor%%.*}"
# The proxy does not expose the git commit, so gitCommit names the module version.
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version"
	k8s_ldflags+=" -X $pkg.gitMajor=$k8s_major"
	k8s_ldflags+=" -X $pkg.gitMinor=$k8s_minor"
	k8s_ldflags+=" -X $pkg.gitCommit=gomod-k8s.io/kubernetes@$k8s_version"
	k8s_ldflags+=" -X $pkg.gitTreeState=clean"
	k8s_ldflags+=" -X $pkg.buildDate=$build_date"
done
# etcd's Version is a constant in api/v3/version; only GitSHA is a variable.
etcd_ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=gomod-$etcd_version"

n=0
build_one() { # <name> <wrapper dir> <package> <ldflags>
	local name="$1" dir="$2" pkg="$3" ldflags="$4" t0=$SECONDS
	n=$((n + 1))
	log "building $name (${n}/${#binaries[@]})... (elapsed $((SECONDS - start))s)"
	(cd "$dir" && go build -trimpath -ldflags="$ldflags" -o "$bin_dir/.$name.tmp" "$pkg") >&2 ||
		die "building $name ($pkg in $dir) failed"
	mv -f "$bin_dir/.$name.tmp" "$bin_dir/$name"
	log "built $name in $((SECONDS - t0))s (elapsed $((SECONDS - start))s)"
}

build_one etcd "$etcd_dir" go.etcd.io/etcd/server/v3 "$etcd_ldflags"
build_one kube-apiserver "$k8s_dir" k8s.io/kubernetes/cmd/kube-apiserver "$k8s_ldflags"
build_one kube-controller-manager "$k8s_dir" k8s.io/kubernetes/cmd/kube-controller-manager "$k8s_ldflags"
build_one kubectl "$k8s_dir" k8s.io/kubernetes/cmd/kubectl "$k8s_ldflags"

{
	echo "KUBERNETES_VERSION=$k8s_version"
	echo "ETCD_VERSION=$etcd_version"
	echo "GO_VERSION=\"$go_version\""
} | cache_close "$start"
