#include "common/cuda_api.h"

#include <dlfcn.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flashdraft {
namespace {

// Opens the first of `names` that loads; the error lists what was tried and dlerror's last word.
absl::StatusOr<void*> Open(const char* what, const std::vector<std::string>& names) {
  std::string last;
  for (const std::string& name : names) {
    if (name.empty()) continue;
    if (void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL)) return lib;
    const char* e = dlerror();
    last = e != nullptr ? e : "";
  }
  return absl::FailedPreconditionError(
      absl::StrCat("cannot load ", what, " (tried ", absl::StrJoin(names, ", "), "): ", last));
}

template <typename F>
void Bind(void* lib, const char* name, F& f, std::vector<std::string>& missing) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (f == nullptr) missing.push_back(name);
}

absl::Status Missing(const char* what, const std::vector<std::string>& missing) {
  if (missing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, " lacks ", absl::StrJoin(missing, ", ")));
}

absl::StatusOr<CudaApi> OpenCuda() {
  const std::string soname = absl::StrCat("libcudart.so.", CUDART_VERSION / 1000);
  absl::StatusOr<void*> lib = Open("the CUDA runtime", {soname, FLASHDRAFT_CUDART_PATH});
  if (!lib.ok()) return lib.status();
  CudaApi a{};
  std::vector<std::string> m;
  Bind(*lib, "cudaGetDeviceCount", a.GetDeviceCount, m);
  Bind(*lib, "cudaGetErrorName", a.GetErrorName, m);
  Bind(*lib, "cudaGetErrorString", a.GetErrorString, m);
  Bind(*lib, "cudaSetDevice", a.SetDevice, m);
  Bind(*lib, "cudaGetDevice", a.GetDevice, m);
  Bind(*lib, "cudaMemGetInfo", a.MemGetInfo, m);
  Bind(*lib, "cudaStreamCreateWithFlags", a.StreamCreateWithFlags, m);
  Bind(*lib, "cudaStreamSynchronize", a.StreamSynchronize, m);
  Bind(*lib, "cudaStreamDestroy", a.StreamDestroy, m);
  Bind(*lib, "cudaStreamWaitEvent", a.StreamWaitEvent, m);
  Bind(*lib, "cudaHostAlloc", a.HostAlloc, m);
  Bind(*lib, "cudaFreeHost", a.FreeHost, m);
  Bind(*lib, "cudaMalloc", a.Malloc, m);
  Bind(*lib, "cudaFree", a.Free, m);
  Bind(*lib, "cudaMemcpyAsync", a.MemcpyAsync, m);
  Bind(*lib, "cudaEventCreateWithFlags", a.EventCreateWithFlags, m);
  Bind(*lib, "cudaEventRecord", a.EventRecord, m);
  Bind(*lib, "cudaEventQuery", a.EventQuery, m);
  Bind(*lib, "cudaEventDestroy", a.EventDestroy, m);
  if (absl::Status s = Missing(soname.c_str(), m); !s.ok()) return s;
  return a;
}

absl::StatusOr<NcclApi> OpenNccl() {
  absl::StatusOr<void*> lib = Open("NCCL", {"libnccl.so.2", FLASHDRAFT_NCCL_PATH});
  if (!lib.ok()) return lib.status();
  NcclApi a{};
  std::vector<std::string> m;
  Bind(*lib, "ncclGetErrorString", a.GetErrorString, m);
  Bind(*lib, "ncclGetLastError", a.GetLastError, m);
  Bind(*lib, "ncclGetUniqueId", a.GetUniqueId, m);
  Bind(*lib, "ncclCommInitRankConfig", a.CommInitRankConfig, m);
  Bind(*lib, "ncclCommGetAsyncError", a.CommGetAsyncError, m);
  Bind(*lib, "ncclCommAbort", a.CommAbort, m);
  Bind(*lib, "ncclAllReduce", a.AllReduce, m);
  Bind(*lib, "ncclAllGather", a.AllGather, m);
  Bind(*lib, "ncclBroadcast", a.Broadcast, m);
  Bind(*lib, "ncclSend", a.Send, m);
  Bind(*lib, "ncclRecv", a.Recv, m);
  Bind(*lib, "ncclGroupStart", a.GroupStart, m);
  Bind(*lib, "ncclGroupEnd", a.GroupEnd, m);
  if (absl::Status s = Missing("libnccl.so.2", m); !s.ok()) return s;
  return a;
}

}  // namespace

absl::StatusOr<const CudaApi*> LoadCuda() {
  static const absl::StatusOr<CudaApi>* const api = new absl::StatusOr<CudaApi>(OpenCuda());
  if (!api->ok()) return api->status();
  return &**api;
}

std::string CudaErrorText(const CudaApi& cuda, cudaError_t error) {
  return absl::StrCat(cuda.GetErrorName(error), ": ", cuda.GetErrorString(error));
}

absl::StatusOr<const NcclApi*> LoadNccl() {
  static const absl::StatusOr<NcclApi>* const api = new absl::StatusOr<NcclApi>(OpenNccl());
  if (!api->ok()) return api->status();
  return &**api;
}

}  // namespace flashdraft
