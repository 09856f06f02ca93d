#include "model/generate.h"

#include <torch/torch.h>

#include <algorithm>

#include "common/status_macros.h"

namespace flashdraft {

absl::StatusOr<std::vector<int64_t>> GreedyGenerate(const TargetModel& model,
                                                    const std::vector<int64_t>& prompt,
                                                    int64_t max_new_tokens,
                                                    const std::vector<int64_t>& stop_ids) {
  if (prompt.empty()) return absl::InvalidArgumentError("GreedyGenerate: empty prompt");
  torch::NoGradGuard no_grad;
  KvCache cache;
  std::vector<int64_t> out;
  if (prompt.size() > 1) {
    const torch::Tensor head =
        torch::tensor(std::vector<int64_t>(prompt.begin(), prompt.end() - 1), torch::kInt64)
            .unsqueeze(0);
    FD_RETURN_IF_ERROR(model.Forward(head, {}, /*with_logits=*/false, &cache).status());
  }
  int64_t next = prompt.back();
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const torch::Tensor input = torch::tensor({next}, torch::kInt64).unsqueeze(0);
    FD_ASSIGN_OR_RETURN(TargetOutput o, model.Forward(input, {}, /*with_logits=*/true, &cache));
    next = o.logits.index({0, -1}).argmax().item<int64_t>();
    out.push_back(next);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
  }
  return out;
}

}  // namespace flashdraft
