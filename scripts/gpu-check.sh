#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU, CUDA (nvcc), CMake, Ninja and a Python with a
# CUDA PyTorch (its LibTorch, CUDA libraries and NCCL are used) but without gRPC/Protobuf/Abseil:
# those come as Debian packages fetched beforehand with scripts/fetch-gpu-debs.sh into .gpu-debs/,
# unpacked here with `dpkg -x` into a private prefix (nothing is installed). Then:
#   1. configure + build the GPU path against the PyTorch LibTorch (-DFLASHDRAFT_WITH_CUDA=ON,
#      NCCL from the nvidia-nccl wheel PyTorch itself uses);
#   2. the NCCL collective's tests (host tensors through device buffers, CUDA tensors in place, the
#      deterministic reduction equal to Gloo's to the bit, two ranks, timeouts) and the gradient
#      reducer's;
#   3. the drafter's step on the GPU against the CPU reference (fp32 within 1e-4, bf16 within the
#      bf16 tolerance) and the precision tests;
#   4. bench/gpu_step_bench at the Qwen3-8B drafter shape (bf16, fp32 peer).
# Meant to finish in under 8 minutes on an H200 with 16 cores. Output: the test summaries and the
# benchmark table; with $OUT set, logs go there too.
#
#   scripts/fetch-gpu-debs.sh          # here, where the Debian mirrors answer
#   scripts/gpu-check.sh [--no-bench]  # there
set -euo pipefail
cd "$(dirname "$0")/.."
bench=1 configure_only=0
for arg in "$@"; do
  case $arg in
    --no-bench) bench=0 ;;
    --configure-only) configure_only=1 ;;  # a dry run of steps up to configure (any machine)
    *) echo "usage: scripts/gpu-check.sh [--no-bench] [--configure-only]" >&2; exit 2 ;;
  esac
done
log_dir=${OUT:-build-gpu}
mkdir -p "$log_dir"
t0=$(date +%s)
stamp() { echo "== [$(($(date +%s) - t0)) s] $*"; }

stamp "the machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
PYTHON=${PYTHON:-python3}  # the Python whose torch (LibTorch) and NCCL are used
$PYTHON -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'

stamp "unpacking $(ls .gpu-debs/*.deb | wc -l) Debian packages into a private prefix"
prefix=/tmp/flashdraft-deps
rm -rf "$prefix" && mkdir -p "$prefix"
for f in .gpu-debs/*.deb; do dpkg -x "$f" "$prefix"; done
lib="$prefix/usr/lib/x86_64-linux-gnu"
export PATH="$prefix/usr/bin:$PATH"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# pkg-config (gRPC finds RE2 with it) reads only the prefix's files, their /usr paths moved into it.
export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$prefix/usr/share/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$prefix"
# Debian's .so links are absolute (/usr/lib/...); point the dangling ones into the prefix.
for l in "$lib"/*.so; do
  if [[ -L "$l" && ! -e "$l" ]]; then ln -sf "$lib/$(basename "$(readlink "$l")")" "$l"; fi
done

torch_cmake=$($PYTHON -c 'import torch; print(torch.utils.cmake_prefix_path)')
nccl_root=$($PYTHON -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
stamp "configuring against $torch_cmake (NCCL: ${nccl_root:-from the CUDA toolkit})"
# CMake 4 refuses package files that ask for policies older than 3.5 (some Debian ones do).
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix/usr;$torch_cmake" -DOPENSSL_ROOT_DIR="$prefix/usr" \
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DFLASHDRAFT_WITH_CUDA=ON \
  ${nccl_root:+-DNCCL_ROOT="$nccl_root"} -DCUDAToolkit_ROOT=/usr/local/cuda \
  >"$log_dir/configure.log" 2>&1 || { tail -60 "$log_dir/configure.log"; exit 1; }
grep "flashdraft:" "$log_dir/configure.log" || true
grep -E "^-- Found (Protobuf|gRPC|absl|glog)|gRPC_DIR|absl_DIR" "$log_dir/configure.log" || true
if [[ $configure_only == 1 ]]; then
  grep -E "^(gRPC|absl|Protobuf|glog|prometheus-cpp|yaml-cpp|GTest|CLI11)_DIR" build-gpu/CMakeCache.txt
  stamp "configured (--configure-only)"
  exit 0
fi

stamp "building the tests and the benchmark"
cmake --build build-gpu -j "$(nproc)" \
  --target flashdraft_worker_test flashdraft_model_test gpu_step_bench \
  >"$log_dir/build.log" 2>&1 || { grep -B2 -A12 "error" "$log_dir/build.log" | head -120; exit 1; }

status=0
stamp "NCCL collective and gradient reducer"
build-gpu/bin/flashdraft_worker_test --gtest_brief=1 \
  --gtest_filter='NcclCollective*:GradientReducer*' 2>&1 | tee "$log_dir/nccl.log" | tail -40 ||
  status=1
stamp "the drafter step on the GPU against the CPU, bf16"
build-gpu/bin/flashdraft_model_test --gtest_brief=1 \
  --gtest_filter='DeviceTest*:PrecisionTest*:TrainerTest*:DrafterParity*' 2>&1 |
  tee "$log_dir/device.log" | tail -40 || status=1
if [[ $bench == 1 ]]; then
  stamp "gpu_step_bench (Qwen3-8B drafter shape)"
  build-gpu/bin/gpu_step_bench --device cuda --preset qwen3-8b --batch 16 --fp32-batch 2 \
    --steps 2 2>&1 | tee "$log_dir/gpu_step_bench.txt" || status=1
fi
stamp "done (status $status)"
exit $status
