// `flashdraft make-shards`: writes the synthetic learnable data set (model/synthetic_data.h) as
// offline shards — manifest.json (with the drafter config of the synthetic target in its metadata),
// shard-*.safetensors (BF16 features) and target.safetensors (the target's frozen embed_tokens and
// lm_head) — so that `flashdraft launch` can train on it before real targets feed the trainer.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace flashdraft {

struct MakeShardsOptions {
  std::string out;
  int64_t samples = 512;
  int64_t seq_len = 128;
  int64_t vocab_size = 128;
  int64_t hidden_size = 64;
  int64_t num_features = 2;  // target layers whose outputs are concatenated
  double noise = 0.1;
  uint64_t seed = 0;
  int64_t samples_per_shard = 128;
};

absl::Status MakeShards(const MakeShardsOptions& options);

}  // namespace flashdraft
