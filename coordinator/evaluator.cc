#include "coordinator/evaluator.h"

#include <torch/torch.h>

#include <memory>

#include "common/status_macros.h"
#include "model/speculative.h"
#include "model/target_model.h"

namespace flashdraft {

absl::StatusOr<Coordinator::Evaluator> MakeEvaluator(const JobConfig& job) {
  struct State {
    std::unique_ptr<TargetModel> target;
    EvalPrompts prompts;
    SpeculativeOptions options;
  };
  auto state = std::make_shared<State>();
  FD_ASSIGN_OR_RETURN(state->target, TargetModel::Load(job.target.path));
  FD_ASSIGN_OR_RETURN(state->prompts, LoadEvalPrompts(job.eval.prompts, job.eval.limit,
                                                      job.target.path, *state->target));
  state->options.max_new_tokens = job.eval.max_new_tokens;
  state->options.block_size = job.eval.block_size;
  state->options.stop_ids = state->prompts.stop_ids;
  return Coordinator::Evaluator(
      [state](const std::string& checkpoint_dir) -> absl::StatusOr<EvalSummary> {
        torch::NoGradGuard no_grad;
        FD_ASSIGN_OR_RETURN(Drafter drafter, LoadDrafterForTarget(checkpoint_dir, *state->target));
        const int64_t block = state->options.block_size > 0 ? state->options.block_size
                                                            : drafter->config().block_size;
        EvalSummary summary;
        summary.accepted_per_position.assign(static_cast<size_t>(block - 1), 0);
        double tau_sum = 0;
        int with_cycles = 0;
        for (const std::vector<int64_t>& prompt : state->prompts.prompts) {
          FD_ASSIGN_OR_RETURN(SpeculativeResult r, SpeculativeGenerate(*state->target, *drafter,
                                                                       prompt, state->options));
          ++summary.prompts;
          if (r.accepted.empty()) continue;
          tau_sum += r.Tau();
          ++with_cycles;
          for (int64_t a : r.accepted) {  // a − 1 drafted tokens accepted, at positions 1 .. a − 1
            ++summary.drafts;
            summary.draft_tokens += block - 1;
            summary.accepted_tokens += a - 1;
            for (int64_t k = 1; k < a; ++k) ++summary.accepted_per_position[k - 1];
          }
        }
        summary.tau = with_cycles > 0 ? tau_sum / with_cycles : 0;
        return summary;
      });
}

}  // namespace flashdraft
