// Greedy speculative decoding with a DFlash drafter, as a server runs it (DFLASH.md §5): the
// target prefills the prompt with its KV cache and gives the first token; then each cycle the
// drafter proposes a block from the target's features of every accepted position, the target
// verifies the block in one forward pass, the longest agreeing prefix plus the target's own next
// token is accepted, and both caches keep only the accepted positions. The output must equal
// plain greedy decoding of the target (the lossless check of `flashdraft eval`).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "model/drafter.h"
#include "model/target_model.h"

namespace flashdraft {

struct SpeculativeOptions {
  int64_t max_new_tokens = 128;
  int64_t block_size = 0;  // 0: the drafter's; at most the drafter's
  std::vector<int64_t> stop_ids;
  // Fault injection (testing the lossless check): every draft is accepted without verification.
  bool accept_unverified = false;
};

struct SpeculativeResult {
  std::vector<int64_t> tokens;  // the new tokens, a stop token included, as GreedyGenerate's
  // Per verify cycle: the tokens it accepted, 1 (the target's own) .. block size.
  std::vector<int64_t> accepted;
  // The mean of `accepted` (τ of this prompt); 0 without cycles.
  double Tau() const;
};

// The drafter's target_layer_ids select the target features it reads.
absl::StatusOr<SpeculativeResult> SpeculativeGenerate(const TargetModel& target,
                                                      DrafterImpl& drafter,
                                                      const std::vector<int64_t>& prompt,
                                                      const SpeculativeOptions& options);

}  // namespace flashdraft
