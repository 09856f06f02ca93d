// Evaluation during training (job.eval): the coordinator binary's CheckpointPipeline::Evaluator. It
// loads the target (target.path) and the held-out prompts (eval.prompts) once, at start, so a bad
// prompt file fails the job before it trains; each evaluation then runs greedy speculative decoding
// (model/speculative.h, as `flashdraft eval` does) with a checkpoint's weights. Needs LibTorch:
// part of the coordinator binary's model library.
#pragma once

#include "absl/status/statusor.h"
#include "common/job_config.h"
#include "coordinator/checkpoint_pipeline.h"

namespace flashdraft {

absl::StatusOr<CheckpointPipeline::Evaluator> MakeEvaluator(const JobConfig& job);

}  // namespace flashdraft
