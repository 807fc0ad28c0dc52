#!/usr/bin/env bash
# Builds (and with --push, pushes) the fabric-agent image for amd64 and arm64 with docker
# buildx. Needs a container engine with buildx; nothing else.
#
#   deploy/agent-image/build.sh IMAGE[:TAG] [--push] [--platform linux/amd64,linux/arm64]
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { sed -n '2,6p' "$0" >&2; exit 2; }
image=$1; shift
platform=linux/amd64,linux/arm64
output=(--output type=image)
while [ $# -gt 0 ]; do
    case $1 in
        --push) output=(--push) ;;
        --platform) platform=$2; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
command -v docker >/dev/null || { echo "docker (with buildx) is needed to build the image" >&2; exit 1; }
docker buildx build --platform "$platform" -f deploy/Dockerfile.agent -t "$image" "${output[@]}" .
