#!/usr/bin/env bash
# Downloads (here, where the Debian mirrors answer) the packages a build on the GPU machine lacks —
# gRPC, Protobuf, Abseil, glog, yaml-cpp, prometheus-cpp, CLI11, GoogleTest, ICU and their
# libraries — into .gpu-debs/ (ignored by git, ~40 MB). scripts/gpu-check.sh unpacks them there
# with `dpkg -x` into a private prefix; nothing is installed on either machine. LibTorch (with CUDA),
# CUDA and NCCL come from the GPU machine's own PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.gpu-debs}
PACKAGES=(
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 protobuf-compiler-grpc
  libprotobuf-dev libprotobuf32 libprotoc32 protobuf-compiler
  libabsl-dev libabsl20220623 libre2-dev libre2-9 libc-ares-dev libc-ares2 libupb-dev zlib1g-dev
  libgoogle-glog-dev libgoogle-glog0v6 libgflags-dev libgflags2.2 libunwind-dev libunwind8
  libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libcli11-dev
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0
  libcivetweb1 libcivetweb-dev civetweb libcurl4-openssl-dev libcurl4
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
  libicu-dev libicu72 libssl-dev
)
mkdir -p "$out"
rm -f "$out"/*.deb
(cd "$out" && apt-get download "${PACKAGES[@]}" >/dev/null)
# Gloo's headers, unpacked there only when PyTorch's wheel lacks them (c10d's ProcessGroupGloo.hpp
# includes them; the wheel's own Gloo is inside libtorch_cpu).
mkdir -p "$out/gloo" && rm -f "$out"/gloo/*.deb
(cd "$out/gloo" && apt-get download libgloo-dev >/dev/null)
echo "$(ls "$out"/*.deb | wc -l) packages, $(du -sh "$out" | cut -f1) in $out"
