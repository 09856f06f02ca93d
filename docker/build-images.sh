#!/usr/bin/env bash
# Builds the flashdraft images from docker/Containerfile: flashdraft-coordinator:<tag>,
# flashdraft-worker:<tag> and flashdraft-feeder:<tag> (CPU; docs/DEPLOY.md).
# Usage: docker/build-images.sh [--prebuilt] [--base IMAGE] [--tag TAG] [--engine podman|docker]
#   --prebuilt  put build/bin's binaries (or $FLASHDRAFT_BIN's; scripts/build.sh on a Debian bookworm
#               host) into the images instead of compiling in a build stage: seconds, not a build
#   --base      the Debian bookworm image to start from (default docker.io/library/debian:bookworm-slim)
#   --tag       the images' tag (default: the project version; never "latest")
set -euo pipefail
cd "$(dirname "$0")/.."
engine=podman
tag=$(sed -n 's/^project(flashdraft VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
base=""
binaries=source
while [[ $# -gt 0 ]]; do
  case $1 in
    --prebuilt) binaries=prebuilt; shift ;;
    --base) base=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --engine) engine=$2; shift 2 ;;
    *) sed -n '2,9p' "$0" >&2; exit 2 ;;
  esac
done
[[ $tag != latest ]] || { echo "build-images: pick a real tag, not 'latest'" >&2; exit 2; }
command -v "$engine" >/dev/null || { echo "build-images: $engine not found" >&2; exit 2; }
if [[ $binaries == prebuilt ]]; then
  rm -rf prebuilt && mkdir prebuilt
  bin=${FLASHDRAFT_BIN:-build/bin}
  for b in flashdraft flashdraft-coordinator flashdraft-worker flashdraft-feeder; do
    [[ -x $bin/$b ]] || { echo "build-images: $bin/$b not found (scripts/build.sh)" >&2; exit 2; }
    strip --strip-debug -o "prebuilt/$b" "$bin/$b"
  done
fi
args=(-f docker/Containerfile --build-arg "BINARIES=$binaries")
[[ -n $base ]] && args+=(--build-arg "BASE=$base")
# HEALTHCHECK is part of the Docker image format (podman's default OCI format drops it).
[[ $engine == podman ]] && args+=(--format docker)
for target in coordinator worker feeder; do
  "$engine" build "${args[@]}" --target "$target" -t "flashdraft-$target:$tag" .
done
echo "build-images: flashdraft-coordinator:$tag flashdraft-worker:$tag flashdraft-feeder:$tag"
