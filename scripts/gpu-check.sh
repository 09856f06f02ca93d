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
#   4. a whole job on the GPU through `flashdraft launch` (coordinator, a worker on cuda:0 over
#      NCCL): over 30 steps fp32 must follow the CPU/Gloo run of the same job (every loss within 1%), bf16
#      within 3%;
#   5. bench/gpu_step_bench at the Qwen3-8B drafter shape (bf16, fp32 peer).
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

# glog's CMake file adds its find modules by absolute path (/usr/share/glog/cmake).
sed -i "s|\"/usr/share/glog/cmake\"|\"$prefix/usr/share/glog/cmake\"|" "$lib/cmake/glog/glog-modules.cmake"

torch_cmake=$($PYTHON -c 'import torch; print(torch.utils.cmake_prefix_path)')
torch_include=$($PYTHON -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
if [[ ! -e $torch_include/gloo/algorithm.h ]]; then
  stamp "PyTorch ships no Gloo headers: Debian's libgloo-dev headers stand in"
  for f in .gpu-debs/gloo/*.deb; do dpkg -x "$f" "$prefix"; done
  rm -rf "$prefix/usr/share/cmake/Gloo"  # its CMake file names a library the prefix has not
fi
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
  --target flashdraft_worker_test flashdraft_model_test gpu_step_bench flashdraft \
  flashdraft-coordinator flashdraft-worker -- -k 0 \
  >"$log_dir/build.log" 2>&1 || { grep -B2 -A12 "error" "$log_dir/build.log" | head -300; exit 1; }

status=0
stamp "NCCL collective and gradient reducer"
build-gpu/bin/flashdraft_worker_test --gtest_brief=1 \
  --gtest_filter='NcclCollective*:GradientReducer*' 2>&1 | tee "$log_dir/nccl.log" | tail -40 ||
  status=1
stamp "the drafter step on the GPU against the CPU, bf16"
build-gpu/bin/flashdraft_model_test --gtest_brief=1 \
  --gtest_filter='DeviceTest*:PrecisionTest*:TrainerTest*:DrafterParity*' 2>&1 |
  tee "$log_dir/device.log" | tail -40 || status=1
stamp "a whole job on the GPU (launch: coordinator + a worker on cuda:0 over NCCL)"
job_dir=/tmp/flashdraft-gpu-job
rm -rf "$job_dir" && mkdir -p "$job_dir"
build-gpu/bin/flashdraft make-shards --out "$job_dir/shards" --samples 96 --seq 64 --vocab 48 \
  --hidden 32 --seed 2 >/dev/null
cat >"$job_dir/job.yaml" <<YAML
name: gpu-check
output_dir: $job_dir/cpu
drafter: {num_hidden_layers: 1, block_size: 8, num_target_features: 2, max_anchors: 8}
data: {source: shards, shards_dir: $job_dir/shards, max_seq_len: 64}
train: {seed: 1, learning_rate: 0.01, max_steps: 30, global_batch_size: 6}
cluster: {heartbeat_interval_seconds: 1, heartbeat_timeout_seconds: 60, collective_timeout_seconds: 120}
checkpoint: {every_steps: 10}
YAML
gpu_job() {  # name, extra --set flags
  local name=$1; shift
  build-gpu/bin/flashdraft launch "$job_dir/job.yaml" --workers 1 --out "$job_dir/$name" "$@" \
    >"$log_dir/job-$name.log" 2>&1 || { tail -30 "$log_dir/job-$name.log"; status=1; }
}
gpu_job cpu
gpu_job cuda-fp32 --set cluster.backend=nccl --set worker.device=cuda
gpu_job cuda-bf16 --set cluster.backend=nccl --set worker.device=cuda --set train.precision=bf16
$PYTHON - "$job_dir" <<'PY' || status=1
import json, sys
def losses(run):
    try:
        with open(f"{sys.argv[1]}/{run}/steps.jsonl") as f:
            return [r["loss"] for r in map(json.loads, f) if "event" not in r]
    except OSError as e:
        print(f"{run}: no steps ({e})")
        return []
cpu = losses("cpu")
ok = len(cpu) == 30
for run, tol in (("cuda-fp32", 0.01), ("cuda-bf16", 0.03)):
    got = losses(run)
    if not got or len(got) != len(cpu):
        ok = False
        continue
    worst = max(abs(a - b) / a for a, b in zip(cpu, got))
    print(f"{run}: {len(got)} steps, loss {got[0]:.4f} -> {got[-1]:.4f} (cpu {cpu[0]:.4f} -> "
          f"{cpu[-1]:.4f}), largest step difference {100 * worst:.3f}% (allowed {100 * tol:g}%)")
    ok = ok and worst <= tol
sys.exit(0 if ok else 1)
PY

if [[ $bench == 1 ]]; then
  stamp "gpu_step_bench (Qwen3-8B drafter shape)"
  build-gpu/bin/gpu_step_bench --device cuda --preset qwen3-8b --batch 16 --fp32-batch 2 \
    --steps 2 2>&1 | tee "$log_dir/gpu_step_bench.txt" || status=1
fi
stamp "done (status $status)"
exit $status
