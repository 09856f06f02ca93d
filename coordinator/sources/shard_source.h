// Offline shards (common/shard_format.h) as a HiddenStateSource: every shard mapped and checked
// against the manifest when opened; features go to the wire straight from the page cache.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_config.h"
#include "common/shard_format.h"
#include "coordinator/sources/hidden_state_source.h"

namespace flashdraft {

class ShardSource : public HiddenStateSource {
 public:
  // Opens and validates every shard against the manifest (errors name the file and tensor).
  static absl::StatusOr<std::unique_ptr<ShardSource>> Open(const std::string& dir);

  uint64_t num_samples() const override { return locations_.size(); }
  int64_t feature_size() const override { return feature_size_; }
  DType feature_dtype() const override { return feature_dtype_; }
  int64_t teacher_size() const override { return teacher_size_; }
  int64_t SampleLength(uint64_t index) const override;
  absl::StatusOr<Sample> Get(uint64_t index) const override;
  // Free-form manifest metadata (e.g. the drafter config the shards were made for).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& dir() const { return dir_; }

 private:
  struct Location {
    uint32_t shard;
    uint32_t local;
  };
  std::string dir_;
  int64_t feature_size_ = 0, teacher_size_ = 0;
  DType feature_dtype_ = DType::kBF16;
  std::vector<ShardFile> shards_;
  std::vector<Location> locations_;
  std::map<std::string, std::string> metadata_;
};

// data.source 'shards': the shards in job.data.shards_dir, the drafter config from its manifest's
// metadata, the target's tensors from its target.safetensors. Other sources need the
// flashdraft-coordinator binary (an UNIMPLEMENTED error says so).
absl::StatusOr<SourceBundle> OpenShardBundle(const JobConfig& job);

}  // namespace flashdraft
