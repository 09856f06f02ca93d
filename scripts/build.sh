#!/usr/bin/env bash
# Configures and builds flashdraft into build/ (or $FLASHDRAFT_BUILD_DIR) with ccache and Ninja.
# Extra arguments go to cmake, e.g. scripts/build.sh -DFLASHDRAFT_WITH_CUDA=ON
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${FLASHDRAFT_BUILD_DIR:-build}
# Two compile jobs per core at most; a torch translation unit takes ~1.6 GB of memory.
JOBS=${FLASHDRAFT_JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Hits across checkouts in different folders (CI clones afresh each time).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
# FLASHDRAFT_TARGETS="a b": build only those targets.
targets=()
for t in ${FLASHDRAFT_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$JOBS" "${targets[@]}"
