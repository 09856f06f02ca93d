#include "coordinator/evaluator.h"

#include <torch/torch.h>

#include <memory>

#include "common/status_macros.h"
#include "model/speculative.h"
#include "model/target_model.h"

namespace flashdraft {

absl::StatusOr<CheckpointPipeline::Evaluator> MakeEvaluator(const JobConfig& job) {
  struct State {
    std::unique_ptr<TargetModel> target;
    EvalPrompts prompts;
    SpeculativeOptions options;
  };
  auto state = std::make_shared<State>();
  FD_ASSIGN_OR_RETURN(state->target, TargetModel::Load(job.target.path));
  FD_ASSIGN_OR_RETURN(
      state->prompts,
      LoadEvalPrompts(job.eval.prompts, job.eval.limit, job.target.path, *state->target,
                      ChatRenderOptions{job.data.enable_thinking, job.data.system_prompt}));
  state->options.max_new_tokens = job.eval.max_new_tokens;
  state->options.block_size = job.eval.block_size;
  state->options.stop_ids = state->prompts.stop_ids;
  state->options.zlab_final_cycle = true;
  return CheckpointPipeline::Evaluator(
      [state](const std::string& checkpoint_dir) -> absl::StatusOr<EvalSummary> {
        torch::NoGradGuard no_grad;
        FD_ASSIGN_OR_RETURN(Drafter drafter, LoadDrafterForTarget(checkpoint_dir, *state->target));
        FD_ASSIGN_OR_RETURN(
            const int64_t block,
            DecodeBlockSize(state->options.block_size, drafter->config(), "eval.block_size"));
        SpeculativeTally tally(block);
        for (const std::vector<int64_t>& prompt : state->prompts.prompts) {
          FD_ASSIGN_OR_RETURN(SpeculativeResult r, SpeculativeGenerate(*state->target, *drafter,
                                                                       prompt, state->options));
          tally.Add(r);
        }
        EvalSummary summary;
        summary.prompts = tally.prompts();
        summary.drafts = tally.cycles();
        summary.draft_tokens = tally.draft_tokens();
        summary.accepted_tokens = tally.accepted_tokens();
        summary.accepted_per_position = tally.AcceptedPerPosition();
        summary.tau = tally.Tau();
        summary.tau_zlab = tally.TauZlab();
        summary.tau_pooled = tally.TauPooled();
        summary.tau_sglang = tally.TauSglang();
        return summary;
      });
}

}  // namespace flashdraft
