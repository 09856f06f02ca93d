// The target model as a feature function: a sample's token ids in, the hidden states of the
// feature layers out ([length, num_features × hidden] in the feature dtype, row-major; with the
// teacher, hidden_size more columns: its last hidden state after the final norm). One
// computation per whole sample, so that whoever runs it (the coordinator's in-process target or a
// feeder, docs/ARCHITECTURE.md) gets the same bits on the same kind of device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/job_config.h"

namespace flashdraft {

class TargetModel;

struct TargetFeatureOptions {
  std::string target_dir;
  std::vector<int> layer_ids;  // empty: DFLASH.md §2 formula with num_features
  int num_features = 5;
  int64_t max_seq_len = 3072;  // sizes the GPU memory check
  DType feature_dtype = DType::kBF16;
  // Each row ends with the target's final-normed last hidden state (train.loss kl / mix).
  bool teacher = false;
  // "cpu" | "cuda" (target.device): cuda runs the target on the first visible GPU in the feature
  // dtype; the CPU runs it in fp32.
  std::string device = "cpu";
  // The embedding, final norm and lm_head only, in the dtype `device` would hold but on the CPU (a
  // coordinator whose feeders compute the features and regenerate): Compute fails.
  bool without_layers = false;
};

// What the job says about the features (target.layer_ids and dtype and device, the drafter's
// num_target_features, data.max_seq_len, whether train.loss needs the teacher), for the target at
// `target_dir`: the coordinator's in-process target and every feeder open it the same way.
TargetFeatureOptions TargetFeatureOptionsFor(const JobConfig& job, const std::string& target_dir);

class TargetFeatures {
 public:
  static absl::StatusOr<std::unique_ptr<TargetFeatures>> Open(const TargetFeatureOptions& o);
  ~TargetFeatures();

  // Thread-safe (the model is only read).
  absl::StatusOr<std::vector<uint8_t>> Compute(const std::vector<int64_t>& input_ids) const;

  // Of a row: the feature layers, then teacher_size() teacher columns.
  int64_t feature_size() const { return feature_size_; }
  int64_t teacher_size() const { return teacher_size_; }
  DType feature_dtype() const { return options_.feature_dtype; }
  // The drafter's feature layers (the teacher's is not among them).
  const std::vector<int>& layer_ids() const { return layers_; }
  const TargetModel& model() const { return *model_; }

 private:
  TargetFeatures() = default;

  TargetFeatureOptions options_;
  std::unique_ptr<TargetModel> model_;
  std::vector<int> layers_;
  std::vector<int> computed_layers_;  // layers_, then the last layer for the teacher
  int64_t feature_size_ = 0, teacher_size_ = 0;
};

}  // namespace flashdraft
