#include "coordinator/initial_weights.h"

#include "common/status_macros.h"
#include "model/drafter.h"
#include "model/export.h"

namespace flashdraft {

absl::StatusOr<std::string> WriteInitialWeights(const JobConfig& job,
                                                const DrafterModelConfig& config) {
  Drafter drafter(config);
  drafter->InitWeights(job.train.seed);
  const std::string path = job.output_dir + "/initial_weights.safetensors";
  FD_RETURN_IF_ERROR(WriteDrafterWeightsF32(*drafter, path));
  return path;
}

}  // namespace flashdraft
