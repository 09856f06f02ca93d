// The CUDA runtime and NCCL, loaded when first needed (dlopen) instead of linked: the binaries of
// a build with the GPU path start on machines without CUDA (CPU nodes, the CPU containers), and a
// GPU job there fails with the reason instead of a loader error. Headers are needed at compile time
// only. Included by the .cc files that call CUDA or NCCL (they include CUDA's headers through it).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "absl/status/statusor.h"

namespace flashdraft {

// The runtime functions flashdraft calls, as cudaX -> X.
struct CudaApi {
  decltype(&cudaGetDeviceCount) GetDeviceCount;
  decltype(&cudaGetErrorName) GetErrorName;
  decltype(&cudaGetErrorString) GetErrorString;
  decltype(&cudaSetDevice) SetDevice;
  decltype(&cudaGetDevice) GetDevice;
  decltype(&cudaMemGetInfo) MemGetInfo;
  decltype(&cudaStreamCreateWithFlags) StreamCreateWithFlags;
  decltype(&cudaStreamSynchronize) StreamSynchronize;
  decltype(&cudaStreamDestroy) StreamDestroy;
  decltype(&cudaStreamWaitEvent) StreamWaitEvent;
  cudaError_t (*HostAlloc)(void**, size_t, unsigned int);  // (C++ overloads: no decltype)
  decltype(&cudaFreeHost) FreeHost;
  cudaError_t (*Malloc)(void**, size_t);
  decltype(&cudaFree) Free;
  decltype(&cudaMemcpyAsync) MemcpyAsync;
  decltype(&cudaEventCreateWithFlags) EventCreateWithFlags;
  decltype(&cudaEventRecord) EventRecord;
  decltype(&cudaEventQuery) EventQuery;
  decltype(&cudaEventDestroy) EventDestroy;
};

// The NCCL functions flashdraft calls, as ncclX -> X.
struct NcclApi {
  decltype(&ncclGetErrorString) GetErrorString;
  decltype(&ncclGetLastError) GetLastError;
  decltype(&ncclGetUniqueId) GetUniqueId;
  decltype(&ncclCommInitRankConfig) CommInitRankConfig;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError;
  decltype(&ncclCommAbort) CommAbort;
  decltype(&ncclAllReduce) AllReduce;
  decltype(&ncclAllGather) AllGather;
  decltype(&ncclBroadcast) Broadcast;
  decltype(&ncclSend) Send;
  decltype(&ncclRecv) Recv;
  decltype(&ncclGroupStart) GroupStart;
  decltype(&ncclGroupEnd) GroupEnd;
};

// Loaded once per process: the library of the CUDA major version built against (libcudart.so.N,
// then the one found at configure time), and NCCL (libnccl.so.2, then the configured one; an
// already loaded copy, e.g. a CUDA LibTorch's, is the one used). FAILED_PRECONDITION names what
// could not be opened or lacks a function.
absl::StatusOr<const CudaApi*> LoadCuda();
// "cudaErrorX: its description", from the loaded runtime.
std::string CudaErrorText(const CudaApi& cuda, cudaError_t error);
absl::StatusOr<const NcclApi*> LoadNccl();

}  // namespace flashdraft
