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
#
# At the tagged commit, the release's files (the version is Cargo.toml's):
#   deploy/release.sh --artifacts DIR [--images IMAGES] [--dry-run]
# writes DIR/fabric-{operator,agent}.oci.tar, each with its SBOM (fabric-NAME.spdx.json),
# DIR/images.env, the chart package DIR/gpufabric-VERSION.tgz and DIR/SHA256SUMS. The images
# are built by deploy/images/build.sh, or taken from IMAGES (a directory build.sh wrote for
# this version: refused when an image's tag is not vVERSION, or its SBOM is missing or names
# another digest). helm comes from $HELM, else tests/tools/build.sh.
#
# Pushes them too, with --push REGISTRY (e.g. ghcr.io/gpufabric, the chart's default):
#   deploy/release.sh --artifacts DIR [--images IMAGES] --push REGISTRY [--dry-run]
# REGISTRY/fabric-{operator,agent}:vVERSION by skopeo (digests preserved: the pushed image is
# the one its SBOM names), and the chart as the OCI artifact oci://REGISTRY/charts/gpufabric,
# version VERSION, by helm push; then checks that the registry serves both digests and the
# chart. Credentials come from $REGISTRY_AUTH_FILE (a docker config.json, as `skopeo login`
# and `helm registry login` write), else from skopeo's and helm's own logins; a registry
# whose certificate a private CA signed is trusted with $REGISTRY_CA_FILE. With --dry-run it
# prints what it would push and pushes nothing. Users install with
# `helm install gpufabric oci://REGISTRY/charts/gpufabric --version VERSION`.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "release.sh: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2; }

new="" dry_run=false krew_url="" krew_dir="" artifacts="" images="" push=""
while [ $# -gt 0 ]; do
	case "$1" in
	--dry-run) dry_run=true ;;
	--artifacts) [ $# -ge 2 ] || usage; artifacts="$2"; shift ;;
	--images) [ $# -ge 2 ] || usage; images="$2"; shift ;;
	--push) [ $# -ge 2 ] || usage; push="${2%/}"; shift ;;
	--krew) [ $# -ge 3 ] || usage; krew_url="$2" krew_dir="$3"; shift 2 ;;
	-h | --help) usage ;;
	-*) die "unknown option $1" ;;
	*) [ -z "$new" ] || usage; new="$1" ;;
	esac
	shift
done

# The release's files, at the tagged commit: images with their SBOMs, the chart, checksums.
release_files() {
	local version out name var image digest archive sbom helm
	version="$(awk -F'"' '/^\[workspace.package\]/ { in_pkg = 1 } in_pkg && /^version = / { print $2; exit }' Cargo.toml)"
	[ -n "$version" ] || die "no version in Cargo.toml's [workspace.package]"
	out="$artifacts"
	if $dry_run; then
		echo "dry run: would write into $out: fabric-operator.oci.tar fabric-operator.spdx.json" \
			"fabric-agent.oci.tar fabric-agent.spdx.json images.env gpufabric-$version.tgz SHA256SUMS" \
			"(images ${images:-built by deploy/images/build.sh --tag v$version})" >&2
		if [ -n "$push" ]; then
			echo "dry run: would push $push/fabric-operator:v$version $push/fabric-agent:v$version" \
				"oci://$push/charts/gpufabric:$version" >&2
		fi
		exit 0
	fi
	mkdir -p "$out"
	out="$(cd "$out" && pwd)"
	if [ -z "$images" ]; then
		deploy/images/build.sh --out "$out" --tag "v$version" >&2
	else
		[ -r "$images/images.env" ] || die "$images/images.env not found: give --images a directory deploy/images/build.sh wrote"
		echo "# The images of release $version, from $images." >"$out/images.env"
		for name in operator agent; do
			var="$(tr '[:lower:]' '[:upper:]' <<<"$name")"
			image="$(sed -n "s/^${var}_IMAGE=//p" "$images/images.env")"
			digest="$(sed -n "s/^${var}_DIGEST=//p" "$images/images.env")"
			archive="$images/fabric-$name.oci.tar" sbom="$images/fabric-$name.spdx.json"
			[ "${image##*:}" = "v$version" ] || die "$images holds $image, not the tag v$version: build the images of this commit"
			[ -f "$archive" ] || die "$archive is missing"
			[ -f "$sbom" ] || die "$sbom is missing: every image of a release has its SBOM (deploy/images/build.sh writes it)"
			grep -q "\"checksumValue\": \"${digest#sha256:}\"" "$sbom" || die "$sbom does not name $image's digest $digest"
			# A hard link where the two are on one file system: the agent is 600 MB.
			ln -f "$archive" "$out/" 2>/dev/null || cp "$archive" "$out/"
			cp "$sbom" "$out/"
			printf '%s_IMAGE=%s\n%s_DIGEST=%s\n%s_ARCHIVE=%s\n%s_SBOM=%s\n' "$var" "$image" "$var" "$digest" \
				"$var" "$out/fabric-$name.oci.tar" "$var" "$out/fabric-$name.spdx.json" >>"$out/images.env"
		done
	fi
	for name in operator agent; do
		[ -f "$out/fabric-$name.spdx.json" ] || die "$out/fabric-$name.spdx.json is missing: the images were built without their SBOM"
	done
	helm="${HELM:-$(tests/tools/build.sh)/helm}"
	"$helm" package charts/gpufabric --destination "$out" >&2
	[ -f "$out/gpufabric-$version.tgz" ] || die "helm package wrote no $out/gpufabric-$version.tgz"
	(cd "$out" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
	echo "release $version: $(cd "$out" && find . -maxdepth 1 -type f -printf '%f ' | LC_ALL=C sort) in $out" >&2
	[ -z "$push" ] || push_files "$version" "$out" "$helm"
	exit 0
}

# The release's files in $2 (version $1) pushed to $push with helm $3, then read back.
push_files() {
	local version="$1" out="$2" helm="$3" name var digest pushed certs
	local skopeo=(skopeo --insecure-policy) helm_args=()
	command -v skopeo >/dev/null || die "skopeo not found: apt-get install skopeo"
	certs="$(mktemp -d)"
	# shellcheck disable=SC2064 # the directory is known now
	trap "rm -rf '$certs'" EXIT
	if [ -n "${REGISTRY_CA_FILE:-}" ]; then
		[ -r "$REGISTRY_CA_FILE" ] || die "REGISTRY_CA_FILE $REGISTRY_CA_FILE cannot be read"
		cp "$REGISTRY_CA_FILE" "$certs/ca.crt"
		helm_args+=(--ca-file "$REGISTRY_CA_FILE")
	fi
	if [ -n "${REGISTRY_AUTH_FILE:-}" ]; then
		[ -r "$REGISTRY_AUTH_FILE" ] || die "REGISTRY_AUTH_FILE $REGISTRY_AUTH_FILE cannot be read"
		helm_args+=(--registry-config "$REGISTRY_AUTH_FILE")
	fi
	for name in operator agent; do
		var="$(tr '[:lower:]' '[:upper:]' <<<"$name")"
		digest="$(sed -n "s/^${var}_DIGEST=//p" "$out/images.env")"
		[ -n "$digest" ] || die "$out/images.env has no ${var}_DIGEST"
		"${skopeo[@]}" copy --quiet --preserve-digests --dest-cert-dir "$certs" \
			"oci-archive:$out/fabric-$name.oci.tar" "docker://$push/fabric-$name:v$version" >&2 ||
			die "pushing fabric-$name to $push failed: log in (skopeo login, or REGISTRY_AUTH_FILE) and check REGISTRY_CA_FILE"
		pushed="$("${skopeo[@]}" inspect --cert-dir "$certs" --format '{{.Digest}}' "docker://$push/fabric-$name:v$version")" ||
			die "reading back $push/fabric-$name:v$version failed"
		[ "$pushed" = "$digest" ] || die "$push/fabric-$name:v$version is $pushed, not the released $digest"
		echo "pushed $push/fabric-$name:v$version@$digest" >&2
	done
	"$helm" push "${helm_args[@]}" "$out/gpufabric-$version.tgz" "oci://$push/charts" >&2 ||
		die "helm push of the chart to oci://$push/charts failed"
	"$helm" show chart "${helm_args[@]}" "oci://$push/charts/gpufabric" --version "$version" 2>/dev/null |
		grep -qx "version: $version" || die "oci://$push/charts/gpufabric does not serve version $version"
	echo "pushed oci://$push/charts/gpufabric:$version" >&2
}
if [ -n "$artifacts" ]; then
	[ -z "$new" ] && [ -z "$krew_url" ] || die "--artifacts writes the files of the current version: run it alone, at the tagged commit"
	release_files
fi
[ -z "$images" ] || die "--images goes with --artifacts"
[ -z "$push" ] || die "--push goes with --artifacts"
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
