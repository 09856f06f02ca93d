#include "worker/collective/collective_factory.h"

#include "absl/strings/str_cat.h"
#include "worker/collective/gloo_collective.h"
#if FLASHDRAFT_WITH_CUDA
#include "worker/collective/nccl_collective.h"
#endif

namespace flashdraft {
namespace {

CollectiveFactory GlooFactory(const CollectiveFactoryOptions& options) {
  GlooOptions gloo;
  gloo.timeout = options.timeout;
  gloo.interface = options.interface;
  gloo.address = options.address;
  return [gloo](c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                const AbortCheck& abort) -> absl::StatusOr<std::unique_ptr<Collective>> {
    return GlooCollective::Create(std::move(store), rank, world_size, gloo, abort);
  };
}

CollectiveFactory NcclFactory(const CollectiveFactoryOptions& options) {
#if FLASHDRAFT_WITH_CUDA
  NcclOptions nccl;
  nccl.timeout = options.timeout;
  nccl.device = options.cuda_device;
  nccl.clock = options.clock;
  return [nccl](c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                const AbortCheck& abort) -> absl::StatusOr<std::unique_ptr<Collective>> {
    return NcclCollective::Create(std::move(store), rank, world_size, nccl, abort);
  };
#else
  (void)options;
  return [](c10::intrusive_ptr<c10d::Store>, int, int,
            const AbortCheck&) -> absl::StatusOr<std::unique_ptr<Collective>> {
    return absl::FailedPreconditionError(
        "cluster.backend is nccl, but this worker was built without the GPU path "
        "(-DFLASHDRAFT_WITH_CUDA=ON)");
  };
#endif
}

}  // namespace

absl::StatusOr<CollectiveFactory> MakeCollectiveFactory(const CollectiveFactoryOptions& options) {
  if (options.backend == "gloo") return GlooFactory(options);
  if (options.backend == "nccl") return NcclFactory(options);
  return absl::InvalidArgumentError(
      absl::StrCat("cluster.backend '", options.backend, "' is not gloo or nccl"));
}

const char* BuiltCollectiveBackends() {
#if FLASHDRAFT_WITH_CUDA
  return "gloo,nccl";
#else
  return "gloo";
#endif
}

}  // namespace flashdraft
