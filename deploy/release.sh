#!/usr/bin/env bash
# Bumps the version of everything released together, in one step: the workspace's crates
# (Cargo.toml, Cargo.lock), the chart's version and appVersion (the images default to
# v<appVersion>), the generated manifests and examples that name the images, and CHANGELOG.md
# (the "Unreleased" notes move under "## VERSION (DATE)", a new empty "Unreleased" above).
#
#   deploy/release.sh 0.3.0 --dry-run   # print what would change (a diff), change nothing
#   deploy/release.sh 0.3.0             # change the files; then review, commit and tag v0.3.0
#
# Fills the krew manifest too when given the archives' base URL and directory:
#   deploy/release.sh 0.3.0 --krew https://example.com/releases/v0.3.0 DIR
# writes DIR/gpufabric.yaml from deploy/krew/gpufabric.yaml with each archive's sha256
# (DIR/kubectl-gpufabric_v0.3.0_linux_{amd64,arm64}.tar.gz must exist).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "release.sh: $*" >&2; exit 1; }
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

new="" dry_run=false krew_url="" krew_dir=""
while [ $# -gt 0 ]; do
	case "$1" in
	--dry-run) dry_run=true ;;
	--krew) [ $# -ge 3 ] || usage; krew_url="$2" krew_dir="$3"; shift 2 ;;
	-h | --help) usage ;;
	-*) die "unknown option $1" ;;
	*) [ -z "$new" ] || usage; new="$1" ;;
	esac
	shift
done
[ -n "$new" ] || usage
[[ "$new" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$ ]] ||
	die "version $new is not MAJOR.MINOR.PATCH[-PRE] (e.g. 0.3.0), without a leading v"

old="$(awk -F'"' '/^\[workspace.package\]/ { in_pkg = 1 } in_pkg && /^version = / { print $2; exit }' Cargo.toml)"
[ -n "$old" ] || die "no version in Cargo.toml's [workspace.package]"
[ "$old" != "$new" ] || die "the version is already $new"
chart_version="$(awk '/^version:/ { print $2; exit }' charts/gpufabric/Chart.yaml)"
[ "$chart_version" = "$old" ] ||
	die "Chart.yaml's version $chart_version differs from Cargo.toml's $old: fix that first"
grep -q '^## Unreleased$' CHANGELOG.md || die "CHANGELOG.md has no \"## Unreleased\" section"
! grep -q "^## $new\b" CHANGELOG.md || die "CHANGELOG.md already has a section \"## $new\""
date="${RELEASE_DATE:-$(date -u +%Y-%m-%d)}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
old_re="${old//./\\.}"

# Each file as it will be, in $work; the repository is changed only at the end.
edit() { # FILE SED-SCRIPT...
	local f="$1"
	shift
	mkdir -p "$work/new/$(dirname "$f")"
	sed "$@" "$f" >"$work/new/$f"
}
edit Cargo.toml -e "/^\[workspace.package\]/,/^\[/ s/^version = \"$old_re\"/version = \"$new\"/"
# The workspace's own packages in the lock file (their version line follows their name).
edit Cargo.lock -e "/^name = \"gpufabric-[a-z-]*\"$/{n;s/^version = \"$old_re\"$/version = \"$new\"/}"
edit charts/gpufabric/Chart.yaml -e "s/^version: $old_re$/version: $new/" \
	-e "s/^appVersion: \"$old_re\"$/appVersion: \"$new\"/"
edit deploy/operator.yaml -e "s/app.kubernetes.io\/version: \"$old_re\"/app.kubernetes.io\/version: \"$new\"/" \
	-e "s/helm.sh\/chart: gpufabric-$old_re$/helm.sh\/chart: gpufabric-$new/" \
	-e "s/\(ghcr.io\/gpufabric\/fabric-[a-z]*\):v$old_re\b/\1:v$new/g"
for f in deploy/examples/*.yaml; do
	edit "$f" -e "s/\(ghcr.io\/gpufabric\/fabric-[a-z]*\):v$old_re\b/\1:v$new/g"
done
edit CHANGELOG.md -e "0,/^## Unreleased$/ s/^## Unreleased$/## Unreleased\n\n## $new ($date)/"

changed=()
for f in $(cd "$work/new" && find . -type f | sed 's|^\./||' | sort); do
	if ! cmp -s "$f" "$work/new/$f"; then
		changed+=("$f")
		$dry_run && diff -u --label "a/$f" --label "b/$f" "$f" "$work/new/$f" || true
	fi
done
for must in Cargo.toml Cargo.lock charts/gpufabric/Chart.yaml CHANGELOG.md; do
	printf '%s\n' "${changed[@]}" | grep -qx "$must" || die "$must would not change: its version is not $old as expected"
done

if [ -n "$krew_url" ]; then
	sums=()
	for arch in amd64 arm64; do
		archive="$krew_dir/kubectl-gpufabric_v${new}_linux_$arch.tar.gz"
		[ -f "$archive" ] || die "$archive is missing: build the plugin for linux/$arch first"
		sums+=("$(sha256sum "$archive" | cut -d' ' -f1)")
	done
	sed -e "s|{{VERSION}}|$new|g" -e "s|{{BASE_URL}}|$krew_url|g" \
		-e "s|{{SHA256_LINUX_AMD64}}|${sums[0]}|g" -e "s|{{SHA256_LINUX_ARM64}}|${sums[1]}|g" \
		deploy/krew/gpufabric.yaml >"$work/gpufabric.yaml"
	! grep -q '{{' "$work/gpufabric.yaml" || die "deploy/krew/gpufabric.yaml has a placeholder release.sh does not fill"
	if $dry_run; then
		echo "--- would write $krew_dir/gpufabric.yaml:"
		cat "$work/gpufabric.yaml"
	else
		cp "$work/gpufabric.yaml" "$krew_dir/gpufabric.yaml"
		echo "wrote $krew_dir/gpufabric.yaml" >&2
	fi
fi

if $dry_run; then
	echo "dry run: $old -> $new would change ${#changed[@]} files: ${changed[*]}" >&2
	exit 0
fi
for f in "${changed[@]}"; do
	cp "$work/new/$f" "$f"
done
echo "$old -> $new: changed ${changed[*]}" >&2
echo "next: review (git diff), commit, tag v$new" >&2
