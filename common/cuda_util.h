// What the CUDA runtime says about this machine's GPUs, for the worker's probe, launch's checks and
// the online target's memory check. Torch-free; in a build without -DFLASHDRAFT_WITH_CUDA=ON every
// call answers that the GPU path is not built.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace flashdraft {

// OK when a CUDA device can be used here; otherwise FAILED_PRECONDITION with the reason (no
// driver, no device, or a build without the GPU path).
absl::Status CudaDeviceUsable();
// The number of CUDA devices this process sees (0 when none is usable).
int CudaDeviceCount();

struct CudaMemory {
  int64_t free_bytes = 0, total_bytes = 0;
};
// cudaMemGetInfo on `device`.
absl::StatusOr<CudaMemory> CudaMemoryInfo(int device);
// The model of visible device `device` ("NVIDIA H200", the driver's cuDeviceGetName), "" where
// there is none or the driver cannot say.
std::string CudaDeviceName(int device);

}  // namespace flashdraft
