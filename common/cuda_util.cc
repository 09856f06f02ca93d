#include "common/cuda_util.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

#if FLASHDRAFT_WITH_CUDA
#include "common/cuda_api.h"
#endif

namespace flashdraft {

#if FLASHDRAFT_WITH_CUDA

absl::Status CudaDeviceUsable() {
  absl::StatusOr<const CudaApi*> cu = LoadCuda();
  if (!cu.ok())
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device: ", cu.status().message()));
  int count = 0;
  const cudaError_t e = (*cu)->GetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device (cudaGetDeviceCount: ", CudaErrorText(**cu, e), ")"));
  }
  if (count == 0) return absl::FailedPreconditionError("no CUDA device is visible");
  return absl::OkStatus();
}

int CudaDeviceCount() {
  absl::StatusOr<const CudaApi*> cu = LoadCuda();
  int count = 0;
  return cu.ok() && (*cu)->GetDeviceCount(&count) == cudaSuccess ? count : 0;
}

absl::StatusOr<CudaMemory> CudaMemoryInfo(int device) {
  FD_RETURN_IF_ERROR(CudaDeviceUsable());
  const CudaApi& cu = **LoadCuda();
  int previous = 0;
  cu.GetDevice(&previous);
  cudaError_t e = cu.SetDevice(device);
  size_t free_bytes = 0, total_bytes = 0;
  if (e == cudaSuccess) e = cu.MemGetInfo(&free_bytes, &total_bytes);
  cu.SetDevice(previous);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cudaMemGetInfo on cuda:", device, ": ", CudaErrorText(cu, e)));
  }
  return CudaMemory{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

std::string CudaDeviceName(int device) {
  // The driver API names the model; the runtime's cudaDeviceProp changes layout between versions.
  using InitFn = int (*)(unsigned);
  using DeviceGetFn = int (*)(int*, int);
  using NameFn = int (*)(char*, int, int);
  static void* const lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return "";
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  auto get = reinterpret_cast<DeviceGetFn>(dlsym(lib, "cuDeviceGet"));
  auto name = reinterpret_cast<NameFn>(dlsym(lib, "cuDeviceGetName"));
  int handle = 0;
  char text[256] = {};
  if (init == nullptr || get == nullptr || name == nullptr || init(0) != 0 ||
      get(&handle, device) != 0 || name(text, sizeof(text) - 1, handle) != 0) {
    return "";
  }
  return text;
}

#else

namespace {
constexpr const char* kNotBuilt =
    "this binary was built without the GPU path (configure with -DFLASHDRAFT_WITH_CUDA=ON)";
}  // namespace

absl::Status CudaDeviceUsable() { return absl::FailedPreconditionError(kNotBuilt); }
int CudaDeviceCount() { return 0; }
absl::StatusOr<CudaMemory> CudaMemoryInfo(int) { return absl::FailedPreconditionError(kNotBuilt); }
std::string CudaDeviceName(int) { return ""; }

#endif

}  // namespace flashdraft
