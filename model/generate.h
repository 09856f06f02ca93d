// Greedy decoding with a target model and its KV cache (prepare --regenerate, evaluation).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "model/target_model.h"

namespace flashdraft {

// Continues `prompt` greedily (argmax) until one of `stop_ids` is produced (it is included in the
// result) or `max_new_tokens` tokens were generated; returns the new tokens only. The prompt is
// prefilled without logits but for its last position, so memory stays O(prompt · hidden).
absl::StatusOr<std::vector<int64_t>> GreedyGenerate(const TargetModel& model,
                                                    const std::vector<int64_t>& prompt,
                                                    int64_t max_new_tokens,
                                                    const std::vector<int64_t>& stop_ids);

}  // namespace flashdraft
