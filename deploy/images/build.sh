#!/usr/bin/env bash
# Builds the fabric-operator and fabric-agent images as OCI archives, from package registries
# alone: no Docker daemon, no container registry. Debian bookworm packages (apt-get download,
# unpacked with dpkg-deb -x, the distroless way), the two binaries (cargo build --locked),
# NVIDIA's NCCL and cuBLAS wheels from PyPI (pinned by version and sha256 in
# deploy/agent-image/versions.env), written by deploy/images/oci.py.
#
#   deploy/images/build.sh [--out DIR] [--repo PREFIX] [--tag TAG] [--only operator|agent]
#                          [--check-reproducible] [--apt-update] [--binaries DIR] [--kit DIR]
#
#   --out DIR             where the archives go (default target/images/)
#   --repo PREFIX         image names are PREFIX/fabric-operator and PREFIX/fabric-agent
#                         (default ghcr.io/gpufabric, the chart's default)
#   --tag TAG             default v<appVersion of charts/gpufabric/Chart.yaml>, the chart's default
#   --only NAME           build one image (operator or agent)
#   --check-reproducible  pack both images a second time from scratch (debs and wheels unpacked
#                         again, every layer rewritten; the cargo binaries are reused, not
#                         rebuilt) and fail unless both manifest digests, and both SBOMs, are
#                         the same
#   --apt-update          refresh the Debian package lists now (otherwise once a day)
#   --binaries DIR        take fabric-operator and fabric-agent from DIR (release builds of
#                         this commit) instead of building them in target/image
#   --kit DIR             for the agent, write instead of its archive a kit to assemble the
#                         same image on a GPU host from that host's own NCCL and cuBLAS (the
#                         pinned versions): DIR/agent-kit.tar.xz (every layer but the two
#                         wheels', and the image's oci.py arguments), small enough to carry.
#                         On the host: deploy/images/assemble-agent.sh KIT OUT (no SBOM is
#                         written for the agent then)
#
# Writes DIR/fabric-operator.oci.tar, DIR/fabric-agent.oci.tar, beside each its SBOM
# (DIR/fabric-NAME.spdx.json, SPDX 2.3 JSON by deploy/images/sbom.py from the package list the
# image carries at /usr/share/gpufabric/packages.txt: Debian packages, PyPI wheels, crates) and
# DIR/images.env (each image's reference, digest, archive and SBOM path, for tests to source). Load on a node with
# `ctr -n k8s.io images import DIR/fabric-operator.oci.tar`; push with
# `skopeo copy oci-archive:DIR/fabric-operator.oci.tar docker://REGISTRY/NAME:TAG`.
#
# Needs: apt-get, apt-cache and dpkg-deb (Debian's apt and dpkg; any Debian or Ubuntu host),
# debian-archive-keyring, python3 (standard library only), cargo, curl, readelf, git.
# Downloads are cached under ${GPUFABRIC_CACHE:-$HOME/.cache/gpufabric}/images/ (Debian lists
# and .debs, the wheels); the binaries are built in target/image/.
#
# Environment: SOURCE_DATE_EPOCH (default: the commit time of HEAD) sets every file time and
# the created time; DEBIAN_MIRROR (default http://deb.debian.org/debian) and
# DEBIAN_SECURITY_MIRROR (default http://deb.debian.org/debian-security) where the packages
# come from, e.g. a snapshot.debian.org URL to rebuild an older image with the same packages;
# PYPI_SIMPLE (default https://pypi.org/simple) the wheel index.
set -Eeuo pipefail
trap 'echo "build.sh: stopped: \"$BASH_COMMAND\" failed (line $LINENO)" >&2' ERR
cd "$(dirname "$0")/../.."
root=$PWD
started=$(date +%s)

die() { echo "build.sh: $*" >&2; exit 1; }
say() { echo "== $*" >&2; }
usage() { sed -n '2,/^set -/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

out=target/images
repo=ghcr.io/gpufabric
tag=
only=
check=false
apt_update=false
binaries=
kit=
while [ $# -gt 0 ]; do
    case $1 in
        --out) out=${2:?--out needs a directory}; shift ;;
        --repo) repo=${2:?--repo needs a prefix such as ghcr.io/gpufabric}; shift ;;
        --tag) tag=${2:?--tag needs a tag}; shift ;;
        --only)
            case ${2:-} in operator|agent) only=$2 ;; *) die "--only takes operator or agent" ;; esac
            shift ;;
        --check-reproducible) check=true ;;
        --apt-update) apt_update=true ;;
        --binaries) binaries=$(realpath "${2:?--binaries needs a directory}"); shift ;;
        --kit) kit=${2:?--kit needs a directory}; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument $1" ;;
    esac
    shift
done
images=(operator agent)
[ -n "$only" ] && images=("$only")

# --- What is needed here, said before anything is downloaded --------------------------------
need() { command -v "$1" >/dev/null || die "$1 is needed: $2"; }
need python3 "it writes the image archives (deploy/images/oci.py, standard library only); apt-get install python3"
need apt-get "the base is Debian bookworm packages fetched with Debian's apt; run this on a Debian or Ubuntu host"
need apt-cache "it comes with apt-get (Debian's apt)"
need dpkg-deb "it unpacks the Debian packages; apt-get install dpkg"
need cargo "it builds the binaries; install Rust with rustup"
need curl "it downloads the NCCL and cuBLAS wheels; apt-get install curl"
need readelf "it checks every library the binaries need is in the image; apt-get install binutils"
need git "it reads the commit the image is built from"
keyring=${DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
[ -r "$keyring" ] || die "$keyring is missing: apt-get install debian-archive-keyring (or set DEBIAN_KEYRING)"

# --- What the images are called and built from ----------------------------------------------
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/gpufabric/Chart.yaml)
[ -n "$app_version" ] || die "no appVersion in charts/gpufabric/Chart.yaml"
tag=${tag:-v$app_version}
revision=$(git rev-parse HEAD)
inputs=(Cargo.toml Cargo.lock crates deploy/images deploy/agent-image)
if [ -n "$(git status --porcelain -- "${inputs[@]}")" ]; then
    echo "build.sh: warning: uncommitted changes in ${inputs[*]}; the revision label says -dirty" >&2
    revision=$revision-dirty
fi
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
source_url=$(sed -n 's/^repository *= *"\(.*\)"$/\1/p' Cargo.toml | head -n 1)
# shellcheck source=../agent-image/versions.env
. deploy/agent-image/versions.env
cache=${GPUFABRIC_CACHE:-$HOME/.cache/gpufabric}/images
mkdir -p "$cache" "$out"
out=$(cd "$out" && pwd)

# The packages, explicitly (as distroless does): no maintainer scripts run, so each package's
# dependencies are listed here or named in SKIPPED_DEPENDS with the reason. check_depends fails
# when a package update brings a dependency neither names.
BASE_DEBS=(base-files gcc-12-base libc6 libgcc-s1 ca-certificates)
# libstdc++6: NCCL links it. libibverbs1 and its providers (mlx5 and others): NCCL opens them to
# use InfiniBand and RoCE; without them it falls back to sockets and the agent would measure a
# path training does not take.
AGENT_DEBS=(libstdc++6 libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200)
# Needed only by maintainer scripts, which never run here: awk (base-files), openssl and
# debconf (ca-certificates builds its bundle with them; this script concatenates it instead),
# adduser (libibverbs1 adds an rdma group).
SKIPPED_DEPENDS=(awk mawk openssl debconf debconf-2.0 adduser)

# --- Debian packages ------------------------------------------------------------------------
aptroot=$cache/apt
apt_conf() {
    mkdir -p "$aptroot"/{etc/apt.conf.d,etc/sources.list.d,etc/preferences.d,state/lists/partial,cache/archives/partial}
    : > "$aptroot/state/status"
    cat > "$aptroot/etc/sources.list" <<EOF
deb [signed-by=$keyring] ${DEBIAN_MIRROR:-http://deb.debian.org/debian} bookworm main
deb [signed-by=$keyring] ${DEBIAN_MIRROR:-http://deb.debian.org/debian} bookworm-updates main
deb [signed-by=$keyring] ${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security} bookworm-security main
EOF
    # A private apt: its own lists and state, bookworm whatever the host runs, no root needed.
    cat > "$aptroot/apt.conf" <<EOF
Dir::Etc::SourceList "$aptroot/etc/sources.list";
Dir::Etc::SourceParts "$aptroot/etc/sources.list.d";
Dir::Etc::Parts "$aptroot/etc/apt.conf.d";
Dir::Etc::Preferences "$aptroot/etc/preferences";
Dir::Etc::PreferencesParts "$aptroot/etc/preferences.d";
Dir::State "$aptroot/state";
Dir::State::status "$aptroot/state/status";
Dir::Cache "$aptroot/cache";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
Acquire::Languages "none";
Debug::NoLocking "true";
APT::Sandbox::User "$(id -un)";
EOF
}
apt_() { APT_CONFIG=$aptroot/apt.conf "$@"; }

fetch_debs() {
    apt_conf
    local stamp=$aptroot/state/updated
    if $apt_update || [ ! -e "$stamp" ] || [ -n "$(find "$stamp" -mmin +1440)" ] \
        || ! cmp -s "$aptroot/etc/sources.list" "$aptroot/state/sources.list.used"; then
        say "Debian bookworm package lists"
        apt_ apt-get update -q >&2 || die "apt-get update of bookworm failed (network, or DEBIAN_MIRROR?)"
        cp "$aptroot/etc/sources.list" "$aptroot/state/sources.list.used"
        touch "$stamp"
    fi
    mkdir -p "$cache/debs"
    local pkg info file sha want=()
    : > "$work/debs.list"
    for pkg in "${BASE_DEBS[@]}" "${AGENT_DEBS[@]}"; do
        info=$(apt_ apt-cache show --no-all-versions "$pkg" 2>/dev/null) \
            || die "Debian package $pkg not found in bookworm (try --apt-update)"
        file=$(sed -n 's/^Filename: //p' <<<"$info"); file=${file##*/}
        sha=$(sed -n 's/^SHA256: //p' <<<"$info")
        echo "$pkg $file $sha" >> "$work/debs.list"
        if [ -e "$cache/debs/$file" ] && [ "$(sha256sum < "$cache/debs/$file" | cut -d' ' -f1)" = "$sha" ]; then
            continue
        fi
        want+=("$pkg=$(sed -n 's/^Version: //p' <<<"$info")")
    done
    if [ ${#want[@]} -gt 0 ]; then
        say "apt-get download ${want[*]}"
        (cd "$cache/debs" && apt_ apt-get download -q "${want[@]}" >&2) || die "apt-get download failed"
    fi
    while read -r pkg file sha; do
        [ "$(sha256sum < "$cache/debs/$file" | cut -d' ' -f1)" = "$sha" ] \
            || die "$file: sha256 differs from the bookworm index's $sha"
    done < "$work/debs.list"
}

deb_file() { awk -v p="$1" '$1 == p { print $2 }' "$work/debs.list"; }

check_depends() {
    local names=" ${BASE_DEBS[*]} ${AGENT_DEBS[*]} ${SKIPPED_DEPENDS[*]} " pkg dep
    for pkg in "${BASE_DEBS[@]}" "${AGENT_DEBS[@]}"; do
        # The first of each set of alternatives, without versions or architecture qualifiers.
        for dep in $(dpkg-deb -f "$cache/debs/$(deb_file "$pkg")" Depends Pre-Depends \
                | sed 's/^[A-Za-z-]*: //' | tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/:.*//; s/ //g'); do
            case $names in *" $dep "*) ;; *)
                die "$pkg depends on $dep, which is neither in the image nor in SKIPPED_DEPENDS (deploy/images/build.sh)" ;;
            esac
        done
    done
}

# Unpacks packages into DIR as dpkg would leave them, less documentation (copyright files stay),
# and records each under var/lib/dpkg/status.d/ so image scanners see the Debian packages.
unpack_debs() {
    local dir=$1 pkg deb; shift
    mkdir -p "$dir/var/lib/dpkg/status.d"
    for pkg in "$@"; do
        deb=$cache/debs/$(deb_file "$pkg")
        dpkg-deb -x "$deb" "$dir"
        dpkg-deb -f "$deb" > "$dir/var/lib/dpkg/status.d/$pkg"
        echo "deb $pkg $(dpkg-deb -f "$deb" Version) $(dpkg-deb -f "$deb" Architecture)" >> "$dir.packages"
    done
    rm -rf "$dir"/usr/share/{man,info,lintian,bug,locale}
    find "$dir/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete 2>/dev/null || true
    find "$dir/usr/share/doc" -mindepth 2 -type d -empty -delete 2>/dev/null || true
}

# --- NCCL and cuBLAS wheels -----------------------------------------------------------------
fetch_wheel() {
    local project=$1 file=$2 want=$3 dest=$cache/wheels/$2 url got
    [ -n "$file" ] && [ -n "$want" ] || die "deploy/agent-image/versions.env names no wheel file and sha256 for $project"
    mkdir -p "$cache/wheels"
    if [ ! -e "$dest" ]; then
        say "PyPI $file"
        url=$(curl -fsSL "${PYPI_SIMPLE:-https://pypi.org/simple}/$project/" \
            | grep -o "href=\"[^\"]*/$file#[^\"]*\"" | head -n 1 | sed 's/^href="//; s/#.*//') \
            || die "$file is not in ${PYPI_SIMPLE:-https://pypi.org/simple}/$project/"
        [ -n "$url" ] || die "$file is not in ${PYPI_SIMPLE:-https://pypi.org/simple}/$project/"
        case $url in http*) ;; *) url=${PYPI_SIMPLE:-https://pypi.org/simple}/$project/$url ;; esac
        curl -fsSL --retry 3 -o "$dest.part" "$url" || die "download of $file failed"
        mv "$dest.part" "$dest"
    fi
    got=$(sha256sum < "$dest" | cut -d' ' -f1)
    if [ "$got" != "$want" ]; then
        rm -f "$dest"
        die "wheel $file: sha256 $got, but deploy/agent-image/versions.env pins $want (removed from the cache; a second mismatch means the pin or the index is wrong)"
    fi
}

# Unpacks the libraries and licences of both wheels and lays them out with the script the
# on-device check runs, one layer per wheel: DIR/nccl and DIR/cublas.
unpack_wheels() {
    local dir=$1
    mkdir -p "$dir/unpacked" "$dir/nccl/opt/gpufabric/licenses" "$dir/cublas/opt/gpufabric/licenses"
    python3 - "$dir/unpacked" "$cache/wheels/$NCCL_WHEEL_FILE" "$cache/wheels/$CUBLAS_WHEEL_FILE" <<'EOF'
import sys, zipfile
dest = sys.argv[1]
for wheel in sys.argv[2:]:
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest, [n for n in z.namelist() if "/lib/lib" in n or n.endswith("/License.txt")])
EOF
    deploy/agent-image/layout-libs.sh "$dir/unpacked" "$dir/libs" >/dev/null
    mkdir -p "$dir/nccl/opt/gpufabric/lib" "$dir/cublas/opt/gpufabric/lib"
    mv "$dir"/libs/libnccl.so* "$dir/nccl/opt/gpufabric/lib/"
    mv "$dir"/libs/libcublas* "$dir/cublas/opt/gpufabric/lib/"
    [ -z "$(ls -A "$dir/libs")" ] || die "layout-libs.sh laid out more than NCCL and cuBLAS: $(ls "$dir/libs")"
    cp "$dir"/unpacked/nvidia_nccl*.dist-info/licenses/License.txt "$dir/nccl/opt/gpufabric/licenses/$NCCL_WHEEL.txt"
    cp "$dir"/unpacked/nvidia_cublas*.dist-info/licenses/License.txt "$dir/cublas/opt/gpufabric/licenses/$CUBLAS_WHEEL.txt"
    rm -rf "$dir/unpacked" "$dir/libs"
    echo "wheel $NCCL_WHEEL $NCCL_VERSION $NCCL_WHEEL_FILE sha256:$NCCL_WHEEL_SHA256" > "$dir/nccl.packages"
    echo "wheel $CUBLAS_WHEEL $CUBLAS_VERSION $CUBLAS_WHEEL_FILE sha256:$CUBLAS_WHEEL_SHA256" > "$dir/cublas.packages"
}

# --- The binaries ---------------------------------------------------------------------------
build_binaries() {
    if [ -n "$binaries" ]; then
        say "binaries from $binaries (stripped)"
        mkdir -p target/image/release
        local b
        for b in fabric-operator fabric-agent; do
            [ -x "$binaries/$b" ] || die "$binaries/$b is missing"
            install -m 0755 "$binaries/$b" "target/image/release/$b"
            strip "target/image/release/$b"
        done
        return
    fi
    say "cargo build --release --locked (target/image)"
    local home=${CARGO_HOME:-$HOME/.cargo}
    # No paths of this machine in the binaries: the workspace reads /src, the cargo home /cargo.
    # Without debug info and stripped, as they ship. mimalloc's C source embeds __DATE__ and
    # __TIME__, which the C compiler takes from SOURCE_DATE_EPOCH: a constant here, not the
    # commit time, which the cc crate watches and would rebuild ring, mimalloc and all that
    # depends on them for at each commit.
    SOURCE_DATE_EPOCH=0 CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_STRIP=symbols \
    RUSTFLAGS="--remap-path-prefix=$root=/src --remap-path-prefix=$home=/cargo" \
    CFLAGS="-ffile-prefix-map=$root=/src -ffile-prefix-map=$home=/cargo" \
        cargo build --release --locked --target-dir target/image \
        -p gpufabric-operator -p gpufabric-agent >&2 \
        || die "cargo build failed"
    local bin
    for bin in fabric-operator fabric-agent; do
        if grep -q -F -e "$root" -e "$home" "target/image/release/$bin"; then
            die "target/image/release/$bin still names a path of this machine ($root or $home)"
        fi
    done
}

# The crates compiled into a binary: normal dependencies, no build scripts or proc macros.
crates_of() {
    cargo tree --locked --offline -q -p "$1" -e normal,no-proc-macro --prefix none --format '{p}' \
        | sed 's/ (\*)$//; s/ (proc-macro)$//' | sort -u \
        | awk '{ src = ($3 ~ /^\(\//) ? "workspace" : "crates.io"; sub(/^v/, "", $2); print "crate " $1 " " $2 " " src }'
}

# --- The layers -----------------------------------------------------------------------------
base_layer() {
    local dir=$1
    unpack_debs "$dir" "${BASE_DEBS[@]}"
    check_depends
    mkdir -p "$dir/etc/ssl/certs" "$dir/home/nonroot" "$dir/root" "$dir/tmp" "$dir/var/tmp"
    # As on an installed Debian system.
    rm -rf "$dir/var/run" "$dir/var/lock"
    ln -s /run "$dir/var/run"
    ln -s /run/lock "$dir/var/lock"
    printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
        'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
        'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' > "$dir/etc/passwd"
    printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' > "$dir/etc/group"
    printf '%s\n' 'hosts: files dns' 'networks: files' 'services: files' 'protocols: files' > "$dir/etc/nsswitch.conf"
    # ldconfig is not in the image, but the NVIDIA container toolkit runs the host's against it.
    echo 'include /etc/ld.so.conf.d/*.conf' > "$dir/etc/ld.so.conf"
    # What update-ca-certificates would write: every Mozilla certificate, in C sort order.
    local crt
    : > "$dir/etc/ssl/certs/ca-certificates.crt"
    while IFS= read -r crt; do
        sed -e '$a\' "$crt" >> "$dir/etc/ssl/certs/ca-certificates.crt"
    done < <(find "$dir/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort)
    [ -s "$dir/etc/ssl/certs/ca-certificates.crt" ] || die "no certificates in the ca-certificates package"
}

agent_debs_layer() { unpack_debs "$1" "${AGENT_DEBS[@]}"; }

bin_layer() {
    local dir=$1 name=$2 packages=$3
    install -D -m 0755 "target/image/release/fabric-$name" "$dir/usr/local/bin/fabric-$name"
    if [ "$name" = agent ]; then
        mkdir -p "$dir/usr/share/gpufabric/fleets"
        cp crates/measure/fleets/*.yaml "$dir/usr/share/gpufabric/fleets/"
        # Here rather than beside the libraries, so that a version change moves only this layer.
        install -D -m 0644 deploy/agent-image/versions.env "$dir/opt/gpufabric/versions.env"
    fi
    install -D -m 0644 "$packages" "$dir/usr/share/gpufabric/packages.txt"
}

# Every library a binary or shared library in the image needs is in the image, and no binary
# needs a newer glibc than the image's. One readelf for all the files.
check_libraries() {
    local name=$1; shift
    local kind elf lib found d sub glibc_image newest
    glibc_image=$(sed -n 's/^deb libc6 \([0-9.]*\)-.*/\1/p' "$work/$name.packages")
    find "$@" -type f \( -path '*/bin/*' -o -name '*.so*' \) -print0 \
        | { xargs -0 readelf -d -V --wide /dev/null 2>/dev/null || true; } \
        | awk '/^File: / { file = $2; next }
               /\(NEEDED\)/ { match($0, /\[.*\]/); print "needs", file, substr($0, RSTART + 1, RLENGTH - 2); next }
               { while (match($0, /GLIBC_[0-9.]+/)) { print "glibc", file, substr($0, RSTART + 6, RLENGTH - 6); $0 = substr($0, RSTART + RLENGTH) } }' \
        > "$work/$name.elf"
    while read -r kind elf lib; do
        [ "$kind" = needs ] || continue
        # Beside it (gconv modules load their helpers so), or on the loader's paths.
        found=false
        [ -e "${elf%/*}/$lib" ] && found=true
        for d in "$@"; do
            for sub in lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu opt/gpufabric/lib; do
                [ -e "$d/$sub/$lib" ] && found=true
            done
        done
        $found || die "fabric-$name image: ${elf#"$work"/} needs $lib, which is not in the image"
    done < "$work/$name.elf"
    newest=$(awk '$1 == "glibc" { print $3, $2 }' "$work/$name.elf" | sort -V | tail -n 1)
    if [ "$(printf '%s\n%s\n' "${newest%% *}" "$glibc_image" | sort -V | tail -n 1)" != "$glibc_image" ]; then
        die "fabric-$name image: ${newest#* }: needs glibc ${newest%% *}, the image has $glibc_image (build on Debian bookworm)"
    fi
    grep -q "^needs .*/fabric-$name " "$work/$name.elf" || die "readelf found no libraries that fabric-$name needs"
}

# Packs the images from the cached downloads and the built binaries into DEST, every layer
# unpacked and written afresh; prints "NAME REF DIGEST COMPRESSED UNCOMPRESSED SECONDS" for each.
pack() {
    local dest=$1 name t0 ref dirs layers args d
    work=$(mktemp -d "$out/.work.XXXXXX")
    mkdir -p "$dest"
    fetch_debs
    base_layer "$work/base"
    if [[ " ${images[*]} " == *" agent "* ]]; then
        agent_debs_layer "$work/agent-debs"
        unpack_wheels "$work/wheels"
    fi
    for name in "${images[@]}"; do
        t0=$(date +%s.%N)
        ref=$repo/fabric-$name:$tag
        dirs=("$work/base")
        if [ "$name" = agent ]; then
            dirs+=("$work/agent-debs" "$work/wheels/nccl" "$work/wheels/cublas")
            cat "$work/base.packages" "$work/agent-debs.packages" "$work/wheels/nccl.packages" \
                "$work/wheels/cublas.packages" "$crates/agent" > "$work/$name.body"
        else
            cat "$work/base.packages" "$crates/operator" > "$work/$name.body"
        fi
        {
            echo "# Every package in $ref ($source_url, commit $revision):"
            echo "# deb NAME VERSION ARCH (Debian bookworm); wheel NAME VERSION FILE SHA256 (PyPI);"
            echo "# crate NAME VERSION SOURCE (Rust, compiled into the binary; Cargo.lock pins them)"
            LC_ALL=C sort "$work/$name.body"
        } > "$work/$name.packages"
        bin_layer "$work/bin-$name" "$name" "$work/$name.packages"
        dirs+=("$work/bin-$name")
        check_libraries "$name" "${dirs[@]}"
        layers=()
        for d in "${dirs[@]}"; do layers+=(--layer "$d"); done
        args=(--ref "$ref" --out "$dest/fabric-$name.oci.tar" --summary "$work/$name.json"
            --entrypoint "/usr/local/bin/fabric-$name" --user 65532:65532
            --chown home/nonroot=65532:65532 --mode home/nonroot=0700 --mode root=0700 --mode tmp=1777 --mode var/tmp=1777
            --label "org.opencontainers.image.title=fabric-$name"
            --label "org.opencontainers.image.source=$source_url"
            --label "org.opencontainers.image.revision=$revision"
            --label "org.opencontainers.image.version=$app_version"
            --label "org.opencontainers.image.created=$created"
            --label "io.gpufabric.image.packages=/usr/share/gpufabric/packages.txt")
        if [ "$name" = agent ]; then
            # The driver (libcuda, NVML) comes from the node, mounted by the NVIDIA container
            # toolkit for these capabilities. NCCL's NVLink SHARP is left as NCCL decides, as
            # in training: the agent measures what training uses.
            args+=(--cmd node-check --env LD_LIBRARY_PATH=/opt/gpufabric/lib
                --env NVIDIA_DRIVER_CAPABILITIES=compute,utility
                --label "org.opencontainers.image.description=gpufabric node agent with NCCL $NCCL_VERSION and cuBLAS $CUBLAS_VERSION; needs NVIDIA driver R$MIN_DRIVER or newer")
        else
            args+=(--label "org.opencontainers.image.description=gpufabric operator: schedules FabricTests, runs benchmark pods, quarantines failing nodes")
        fi
        if [ -n "$kit" ] && [ "$name" = agent ]; then
            write_kit "$dest" "${args[@]}"
            continue
        fi
        python3 deploy/images/oci.py "${layers[@]}" "${args[@]}" >&2 || die "oci.py failed for fabric-$name"
        # The image's SBOM beside it, from the list the image carries, naming its digest.
        python3 deploy/images/sbom.py --packages "$work/$name.packages" --ref "$ref" \
            --digest "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["digest"])' "$work/$name.json")" \
            --created "$created" --source "$source_url" --revision "$revision" \
            --out "$dest/fabric-$name.spdx.json" >&2 || die "sbom.py failed for fabric-$name"
        python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
print(sys.argv[2], s["ref"], s["digest"], s["compressed_size"], s["uncompressed_size"],
      "%.1f" % (float(sys.argv[4]) - float(sys.argv[3])))' "$work/$name.json" "$name" "$t0" "$(date +%s.%N)"
    done
    rm -rf "$work"
}

# The agent's kit (--kit): its layers but the two wheels', in the image's order, and the
# arguments oci.py was to get, for deploy/images/assemble-agent.sh to finish on a GPU host.
write_kit() {
    local dest=$1; shift
    mkdir -p "$kit/.stage/layers"
    cp -a "$work/base" "$kit/.stage/layers/1-base"
    cp -a "$work/agent-debs" "$kit/.stage/layers/2-agent-debs"
    cp -a "$work/bin-agent" "$kit/.stage/layers/5-bin"
    printf '%s\n' "$@" | sed "s|^$dest/fabric-agent.oci.tar\$|@OUT@|; s|^$work/agent.json\$|@SUMMARY@|" \
        > "$kit/.stage/oci-args"
    cp deploy/agent-image/versions.env "$kit/.stage/versions.env"
    echo "$SOURCE_DATE_EPOCH" > "$kit/.stage/epoch"
    cat "$work/wheels/nccl.packages" "$work/wheels/cublas.packages" > "$kit/.stage/wheels"
    tar -C "$kit/.stage" -cf - . | xz -T0 -6 > "$kit/agent-kit.tar.xz"
    rm -rf "$kit/.stage"
}

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

say "images $repo/fabric-{$(IFS=,; echo "${images[*]}")}:$tag from $revision (SOURCE_DATE_EPOCH $SOURCE_DATE_EPOCH)"
crates=$(mktemp -d)
trap 'rm -rf "$crates" "$out"/.work.*' EXIT
t0=$(date +%s)
build_binaries
# Read once: a second pack lists the same crates as the first.
crates_of gpufabric-operator > "$crates/operator"
crates_of gpufabric-agent > "$crates/agent"
[ -s "$crates/agent" ] && [ -s "$crates/operator" ] || die "cargo tree listed no crates"
t_cargo=$(( $(date +%s) - t0 ))

t0=$(date +%s)
if [[ " ${images[*]} " == *" agent "* ]]; then
    fetch_wheel "$NCCL_WHEEL" "${NCCL_WHEEL_FILE:-}" "${NCCL_WHEEL_SHA256:-}"
    fetch_wheel "$CUBLAS_WHEEL" "${CUBLAS_WHEEL_FILE:-}" "${CUBLAS_WHEEL_SHA256:-}"
fi
t_wheels=$(( $(date +%s) - t0 ))

t0=$(date +%s)
pack "$out" > "$crates/first"
t_pack=$(( $(date +%s) - t0 ))

{
    echo "# Written by deploy/images/build.sh from commit $revision."
    while read -r name ref digest _; do
        var=$(tr '[:lower:]' '[:upper:]' <<<"$name")
        echo "${var}_IMAGE=$ref"
        echo "${var}_DIGEST=$digest"
        echo "${var}_ARCHIVE=$out/fabric-$name.oci.tar"
        echo "${var}_SBOM=$out/fabric-$name.spdx.json"
    done < "$crates/first"
} > "$out/images.env"

echo
printf '%-16s %-71s %11s %13s %7s\n' image digest compressed uncompressed packed
while read -r name ref digest compressed uncompressed seconds; do
    printf '%-16s %-71s %11s %13s %6ss\n' "fabric-$name" "$digest" "$(mib "$compressed")" "$(mib "$uncompressed")" "$seconds"
done < "$crates/first"
echo "cargo ${t_cargo}s, wheels ${t_wheels}s, Debian packages and packing ${t_pack}s, total $(( $(date +%s) - started ))s"
if [ -n "$kit" ]; then
    echo "wrote $kit/agent-kit.tar.xz (assemble on a GPU host: deploy/images/assemble-agent.sh)"
else
    echo "wrote $(for n in "${images[@]}"; do printf '%s ' "$out/fabric-$n.oci.tar" "$out/fabric-$n.spdx.json"; done)$out/images.env"
fi

if $check; then
    say "packing again from scratch to compare digests (the cargo binaries are reused, not rebuilt)"
    t0=$(date +%s)
    rm -rf "$out/.again"
    pack "$out/.again" > "$crates/second"
    echo "second pack $(( $(date +%s) - t0 ))s"
    failed=false
    while read -r name _ digest _; do
        again=$(awk -v n="$name" '$1 == n { print $3 }' "$crates/second")
        if [ "$digest" = "$again" ] && cmp -s "$out/fabric-$name.spdx.json" "$out/.again/fabric-$name.spdx.json"; then
            echo "reproducible: fabric-$name $digest (and its SBOM)"
        else
            echo "NOT REPRODUCIBLE: fabric-$name packed to $digest, then to $again (or its SBOM differs: diff the two fabric-$name.spdx.json)" >&2
            failed=true
        fi
    done < "$crates/first"
    $failed && die "two packs of one commit differ; both are kept: $out/fabric-NAME.oci.tar and $out/.again/fabric-NAME.oci.tar (list a layer with tar -xOf ARCHIVE blobs/sha256/DIGEST | tar -tvz)"
    rm -rf "$out/.again"
fi
