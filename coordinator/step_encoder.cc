#include "coordinator/step_encoder.h"

#include <algorithm>

#include "common/chunk_wire.h"
#include "common/status_macros.h"
#include "coordinator/microbatch_packer.h"
#include "flashdraft/v1/coordinator.pb.h"

namespace flashdraft {

namespace {

v1::Microbatch ShardHeader(const StepPlan& plan, int64_t shard, const ShardAddress& to) {
  v1::Microbatch m;
  m.set_step(plan.step);
  m.set_membership_epoch(to.membership_epoch);
  m.set_rank(to.rank);
  m.set_world_size(to.world_size);
  m.set_global_weight_sum(plan.global_weight_sum);
  m.set_learning_rate(to.learning_rate);
  m.set_num_tensors(MicrobatchPacker::NumTensors(to.teacher));
  m.set_shard(static_cast<uint32_t>(shard));
  m.set_num_shards(static_cast<uint32_t>(plan.shards.size()));
  for (int64_t offset : plan.shard_offsets) m.add_shard_offsets(static_cast<uint32_t>(offset));
  return m;
}

}  // namespace

absl::Status EncodeShard(const StepPlan& plan, int64_t shard, const ShardAddress& to,
                         const HiddenStateSource& source, const Scheduler& scheduler,
                         std::vector<grpc::ByteBuffer>* messages) {
  const MicrobatchPlan& mb = plan.shards[shard];
  v1::CoordinatorMessage header;
  *header.mutable_microbatch() = ShardHeader(plan, shard, to);
  messages->push_back(MessageToBuffer(header));

  int64_t s = 1;
  for (int64_t len : mb.lengths) s = std::max(s, len);
  MicrobatchPacker packer(static_cast<int64_t>(mb.samples.size()), s,
                          FeatureColumns::Of(source, to.teacher));
  for (uint64_t index : mb.samples) {
    FD_ASSIGN_OR_RETURN(Sample sample, source.Get(index));
    scheduler.Truncate(sample);
    std::vector<int64_t> anchors = scheduler.Anchors(sample, plan.step);
    FD_RETURN_IF_ERROR(packer.Add(sample, std::move(anchors)));
  }
  return packer.Encode(messages);
}

absl::StatusOr<v1::ShardWork> MakeShardWork(const StepPlan& plan, int64_t shard,
                                            const ShardAddress& to, const HiddenStateSource& source,
                                            const Scheduler& scheduler, std::string ticket) {
  v1::ShardWork work;
  work.set_ticket(std::move(ticket));
  *work.mutable_header() = ShardHeader(plan, shard, to);
  for (uint64_t index : plan.shards[shard].samples) {
    FD_ASSIGN_OR_RETURN(Sample sample, source.GetTokens(index));
    v1::FeedSample* f = work.add_samples();
    f->set_index(index);
    f->mutable_input_ids()->Assign(sample.input_ids.begin(), sample.input_ids.end());
    scheduler.Truncate(sample);
    f->set_length(static_cast<uint32_t>(sample.length()));
    std::string* mask = f->mutable_loss_mask();
    for (int64_t m : sample.loss_mask) mask->push_back(m != 0 ? 1 : 0);
    const std::vector<int64_t> anchors = scheduler.Anchors(sample, plan.step);
    f->mutable_anchors()->Assign(anchors.begin(), anchors.end());
  }
  return work;
}

}  // namespace flashdraft
