#!/usr/bin/env bash
# Packaging tools for the chart and metrics tests, once, into a cache dir:
#   helm              built from its Go module (tests/tools/helm/go.mod pins the version)
#   prometheus, promtool  from Debian's `prometheus` package (apt-get download, unpacked
#                     with dpkg-deb -x: no root needed, nothing installed system-wide)
#
#   BIN=$(tests/tools/build.sh)          # build/fetch if needed, print the bin dir
#   tests/tools/build.sh --print-bin-dir # print the bin dir, build nothing
#
# Progress goes to stderr; the bin directory is the ONLY line on stdout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_tag=tools
binaries=(helm prometheus promtool)
# shellcheck source=tests/build-cache.sh
source "$here/../build-cache.sh"
usage() { sed -n '2,11p' "$0"; }
cache_parse_args usage "$@"

# Bump when the steps below change, so old cached tools are not reused.
BUILD_SCHEME=2

helm_dir="$here/helm"

helm_version="$(awk '$1 == "require" && $2 == "helm.sh/helm/v3" { print $3; exit }' "$helm_dir/go.mod")"
[[ -n "$helm_version" ]] || die "cannot read the helm.sh/helm/v3 version from $helm_dir/go.mod"
# The Kubernetes version `helm template` and `helm lint` assume without a cluster, set as
# helm's own release build sets it (from its client-go, v0.33 -> 1.33); left unset it is 1.20,
# and the chart's kubeVersion (>= 1.30) refuses every render.
client_go="$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$helm_dir/go.mod")"
k8s_minor="$(echo "$client_go" | sed -n 's/^v0\.\([0-9]*\)\..*/\1/p')"
[[ -n "$k8s_minor" ]] || die "cannot read the k8s.io/client-go version from $helm_dir/go.mod"
go_version="$(go version 2>/dev/null || echo none)"
key="$(
	{
		echo "scheme=$BUILD_SCHEME"
		echo "helm=$helm_version"
		echo "go=$go_version"
		sha256sum <"$helm_dir/go.mod"
		sha256sum <"$helm_dir/go.sum"
	} | sha256sum | cut -c1-16
)"
cache_open tools "$key"
start=$SECONDS

if [[ ! -x "$bin_dir/helm" ]]; then
	command -v go >/dev/null 2>&1 || die "go not found in PATH: helm is built from its Go module"
	log "building helm $helm_version with $go_version (a cold build takes a few minutes)"
	(
		cd "$helm_dir"
		export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" GOWORK=off CGO_ENABLED=0
		go build -trimpath \
			-ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version \
				-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
				-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor" \
			-o "$bin_dir/.helm.tmp" helm.sh/helm/v3/cmd/helm
	) >&2 || die "building helm failed"
	mv -f "$bin_dir/.helm.tmp" "$bin_dir/helm"
	log "built helm in $((SECONDS - start))s"
fi

if [[ ! -x "$bin_dir/prometheus" || ! -x "$bin_dir/promtool" ]]; then
	command -v apt-get >/dev/null 2>&1 || die "apt-get not found: prometheus and promtool come from Debian's prometheus package"
	work="$(mktemp -d)"
	trap 'rm -rf "$work"' EXIT
	log "downloading Debian's prometheus package"
	if ! (cd "$work" && apt-get download prometheus) >&2; then
		log "apt-get download failed; refreshing the package lists and retrying"
		if [[ "$(id -u)" == 0 ]]; then apt-get update >&2; else sudo -n apt-get update >&2; fi ||
			die "cannot refresh the package lists (apt-get update)"
		(cd "$work" && apt-get download prometheus) >&2 || die "apt-get download prometheus failed"
	fi
	dpkg-deb -x "$work"/prometheus_*.deb "$work/root" || die "unpacking the prometheus package failed"
	for b in prometheus promtool; do
		install -m 0755 "$work/root/usr/bin/$b" "$bin_dir/$b"
	done
	dpkg-deb -f "$work"/prometheus_*.deb Version >"$key_dir/prometheus.version"
	log "prometheus $(cat "$key_dir/prometheus.version") unpacked"
fi

{
	echo "HELM_VERSION=$helm_version"
	echo "PROMETHEUS_VERSION=$(cat "$key_dir/prometheus.version" 2>/dev/null || echo unknown)"
	echo "GO_VERSION=\"$go_version\""
} | cache_close "$start"
