#include "coordinator/step_encoder.h"

#include <algorithm>

#include "common/chunk_wire.h"
#include "common/status_macros.h"
#include "coordinator/microbatch_packer.h"
#include "flashdraft/v1/coordinator.pb.h"

namespace flashdraft {

absl::Status EncodeShard(const StepPlan& plan, int64_t shard, const ShardAddress& to,
                         const HiddenStateSource& source, const Scheduler& scheduler,
                         std::vector<grpc::ByteBuffer>* messages) {
  const MicrobatchPlan& mb = plan.shards[shard];
  v1::CoordinatorMessage header;
  v1::Microbatch* m = header.mutable_microbatch();
  m->set_step(plan.step);
  m->set_membership_epoch(to.membership_epoch);
  m->set_rank(to.rank);
  m->set_world_size(to.world_size);
  m->set_global_weight_sum(plan.global_weight_sum);
  m->set_learning_rate(to.learning_rate);
  m->set_num_tensors(MicrobatchPacker::kNumTensors);
  m->set_shard(static_cast<uint32_t>(shard));
  m->set_num_shards(static_cast<uint32_t>(plan.shards.size()));
  for (int64_t offset : plan.shard_offsets) m->add_shard_offsets(static_cast<uint32_t>(offset));
  messages->push_back(MessageToBuffer(header));

  int64_t s = 1;
  for (int64_t len : mb.lengths) s = std::max(s, len);
  MicrobatchPacker packer(static_cast<int64_t>(mb.samples.size()), s, source.feature_size(),
                          source.feature_dtype());
  for (uint64_t index : mb.samples) {
    FD_ASSIGN_OR_RETURN(Sample sample, source.Get(index));
    scheduler.Truncate(sample);
    std::vector<int64_t> anchors = scheduler.Anchors(sample, plan.step);
    FD_RETURN_IF_ERROR(packer.Add(sample, std::move(anchors)));
  }
  return packer.Encode(messages);
}

}  // namespace flashdraft
