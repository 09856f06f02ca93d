// The data plane of one step: each shard of a StepPlan as the Microbatch header and tensor chunks
// its rank receives. A function of the plan, the epoch and the data; it sends nothing.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/scheduler.h"
#include "coordinator/sources/hidden_state_source.h"
#include "flashdraft/v1/feeder.pb.h"

namespace flashdraft {

// Who a shard goes to and how that step trains.
struct ShardAddress {
  uint64_t membership_epoch = 0;
  int rank = 0;
  int world_size = 0;
  double learning_rate = 0;
  // The shard carries the target's final hidden state as teacher_hidden (train.loss kl / mix).
  bool teacher = false;
};

// Appends shard `shard` of `plan` to `messages`: its Microbatch header, then its right-padded
// [b, S] batch of samples (read from `source`, truncated and given anchors by `scheduler`).
absl::Status EncodeShard(const StepPlan& plan, int64_t shard, const ShardAddress& to,
                         const HiddenStateSource& source, const Scheduler& scheduler,
                         std::vector<grpc::ByteBuffer>* messages);

// The same shard as work for a feeder (proto/flashdraft/v1/feeder.proto): its Microbatch header
// and, per sample, the whole tokenized sample (the target runs on all of it), the tokens kept and
// the anchors; no features. A feeder that computes the features as `source` does turns it into
// EncodeShard's messages, bit for bit (feeder/shard_builder.h).
absl::StatusOr<v1::ShardWork> MakeShardWork(const StepPlan& plan, int64_t shard,
                                            const ShardAddress& to, const HiddenStateSource& source,
                                            const Scheduler& scheduler, std::string ticket);

}  // namespace flashdraft
