#include "common/cuda_util.h"

#include "absl/strings/str_cat.h"

#if FLASHDRAFT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace flashdraft {

#if FLASHDRAFT_WITH_CUDA

namespace {
std::string CudaText(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}
}  // namespace

bool BuiltWithCuda() { return true; }

absl::Status CudaDeviceUsable() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device (cudaGetDeviceCount: ", CudaText(e), ")"));
  }
  if (count == 0) return absl::FailedPreconditionError("no CUDA device is visible");
  return absl::OkStatus();
}

int CudaDeviceCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

absl::StatusOr<CudaMemory> CudaMemoryInfo(int device) {
  int previous = 0;
  cudaGetDevice(&previous);
  cudaError_t e = cudaSetDevice(device);
  size_t free_bytes = 0, total_bytes = 0;
  if (e == cudaSuccess) e = cudaMemGetInfo(&free_bytes, &total_bytes);
  cudaSetDevice(previous);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cudaMemGetInfo on cuda:", device, ": ", CudaText(e)));
  }
  return CudaMemory{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

#else

namespace {
constexpr const char* kNotBuilt =
    "this binary was built without the GPU path (configure with -DFLASHDRAFT_WITH_CUDA=ON)";
}  // namespace

bool BuiltWithCuda() { return false; }
absl::Status CudaDeviceUsable() { return absl::FailedPreconditionError(kNotBuilt); }
int CudaDeviceCount() { return 0; }
absl::StatusOr<CudaMemory> CudaMemoryInfo(int) { return absl::FailedPreconditionError(kNotBuilt); }

#endif

}  // namespace flashdraft
