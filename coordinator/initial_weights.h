// The drafter's starting weights, written once by the coordinator and streamed to every worker by
// FetchTensors (so all ranks start from the same bytes, whatever their device or RNG). Needs
// LibTorch: part of the coordinator binary's model library, not of flashdraft_coordinator_lib.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/job_config.h"
#include "model/drafter_config.h"

namespace flashdraft {

// Initializes a drafter for `config` from job.train.seed (DrafterImpl::InitWeights), or loads it
// from job.drafter.init_from (its config.json must describe the same shapes: an error names the
// field that differs, or the tensor), and writes its trainable parameters (F32, their parameter
// names) to <output_dir>/initial_weights.safetensors; returns that path.
// Coordinator::WeightsFactory.
absl::StatusOr<std::string> WriteInitialWeights(const JobConfig& job,
                                                const DrafterModelConfig& config);

}  // namespace flashdraft
