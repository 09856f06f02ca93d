#!/usr/bin/env bash
# Installs the Debian packages flashdraft needs to build, test and run on a CPU machine.
# Idempotent: when every package is already installed it returns in well under a second.
# Usage: scripts/setup.sh            (as root, or with sudo available)
set -euo pipefail

PACKAGES=(
  # build tools
  build-essential cmake ninja-build ccache pkg-config clang-format
  # LibTorch (CPU, with c10d Gloo) and the Gloo headers it needs
  libtorch-dev libgloo-dev
  # fast CPU BLAS for LibTorch's matmuls (3-4x over the reference BLAS)
  libopenblas0-pthread
  # gRPC + Protobuf
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # Abseil, logging, metrics, config, JSON, CLI
  libabsl-dev libgoogle-glog-dev prometheus-cpp-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # reference numerics for parity tests (/usr/bin/python3 with Debian's torch)
  python3-torch
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi

echo "setup: installing ${#missing[@]} packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
