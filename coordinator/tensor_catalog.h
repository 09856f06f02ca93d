// The tensors the coordinator serves (FetchTensors): the target's frozen embedding and head, the
// drafter's starting weights (fresh, or a checkpoint's when resumed) and, when resumed, the
// optimizer state. Immutable once built; shared with gRPC slices that point into the mapped files.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/safetensors.h"
#include "coordinator/checkpoint.h"
#include "coordinator/numerics_group.h"

namespace flashdraft {

// One tensor FetchTensors streams: `name` in `file`, sent as `wire_name`.
struct FetchEntry {
  std::shared_ptr<const SafetensorsModel> file;
  std::string name;
  std::string wire_name;
};

// The newest checkpoint a resumed job continues from.
struct ResumePoint {
  CheckpointInfo checkpoint;
  RecordedNumerics numerics;  // what computed it
};

// The newest checkpoint in `store` a job with `fingerprint` and `total_steps` steps can continue
// from; none when there is no checkpoint; an error naming the checkpoint when it belongs to another
// job or holds more steps.
absl::StatusOr<std::optional<ResumePoint>> FindResumePoint(const CheckpointStore& store,
                                                           const std::string& fingerprint,
                                                           int64_t total_steps);

class TensorCatalog {
 public:
  // `target`: the target's tensors (embed_tokens.weight, lm_head.weight unless tied); `weights`:
  // the drafter's starting weights; `optimizer`: the optimizer state (null unless resumed).
  TensorCatalog(std::shared_ptr<const SafetensorsModel> target,
                std::shared_ptr<const SafetensorsModel> weights,
                std::shared_ptr<const SafetensorsModel> optimizer)
      : target_(std::move(target)),
        weights_(std::move(weights)),
        optimizer_(std::move(optimizer)) {}

  // What FetchTensors streams for `names` (empty: everything a worker starts from), or the error
  // naming a tensor the coordinator does not have (never a path of this host).
  absl::StatusOr<std::vector<FetchEntry>> Resolve(const std::vector<std::string>& names) const;
  const SafetensorsModel& target() const { return *target_; }
  const SafetensorsModel& weights() const { return *weights_; }

 private:
  std::shared_ptr<const SafetensorsModel> target_;
  std::shared_ptr<const SafetensorsModel> weights_;
  std::shared_ptr<const SafetensorsModel> optimizer_;
};

}  // namespace flashdraft
