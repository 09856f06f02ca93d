// Offline shards: a directory with manifest.json and safetensors shard files, each holding many
// samples back to back:
//   input_ids [T] I64, loss_mask [T] U8, hidden_states [T, n·H] (BF16 or F32), offsets [k+1] I64
// where sample i of the shard spans tokens offsets[i] .. offsets[i+1]. manifest.json:
//   {"format": "flashdraft-shards-v1", "feature_size": n·H, "feature_dtype": "BF16",
//    "num_samples": N, "shards": [{"file": "shard-00000.safetensors", "num_samples": k,
//    "num_tokens": T}, ...], "metadata": {...}}
// Shards are mapped, not read: features go to the wire straight from the page cache.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_config.h"
#include "common/safetensors.h"
#include "coordinator/sources/hidden_state_source.h"

namespace flashdraft {

inline constexpr const char* kShardFormat = "flashdraft-shards-v1";

class ShardSource : public HiddenStateSource {
 public:
  // Opens and validates every shard against the manifest (errors name the file and tensor).
  static absl::StatusOr<std::unique_ptr<ShardSource>> Open(const std::string& dir);

  uint64_t num_samples() const override { return locations_.size(); }
  int64_t feature_size() const override { return feature_size_; }
  DType feature_dtype() const override { return feature_dtype_; }
  int64_t SampleLength(uint64_t index) const override;
  absl::StatusOr<Sample> Get(uint64_t index) const override;
  // Free-form manifest metadata (e.g. the drafter config the shards were made for).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& dir() const { return dir_; }

 private:
  struct Shard {
    std::unique_ptr<SafetensorsFile> file;
    TensorView input_ids, loss_mask, features;
    std::vector<int64_t> offsets;
  };
  struct Location {
    uint32_t shard;
    uint32_t local;
  };
  std::string dir_;
  int64_t feature_size_ = 0;
  DType feature_dtype_ = DType::kBF16;
  std::vector<Shard> shards_;
  std::vector<Location> locations_;
  std::map<std::string, std::string> metadata_;
};

// Writes samples into shards of at most `samples_per_shard` and the manifest last (a directory
// without a manifest is an unfinished write).
class ShardWriter {
 public:
  ShardWriter(std::string dir, int64_t feature_size, DType feature_dtype,
              int64_t samples_per_shard);
  // `features`: length × feature_size elements of the writer's dtype.
  absl::Status Add(const std::vector<int64_t>& input_ids, const std::vector<int64_t>& loss_mask,
                   const void* features);
  void SetMetadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Adopts the complete shard files an interrupted run left in the directory (shard-00000, -00001,
  // ... in order, each validated); returns how many samples they hold, to be skipped by the caller.
  absl::StatusOr<int64_t> ResumeExisting();
  absl::Status Finish();

 private:
  absl::Status FlushShard();

  std::string dir_;
  int64_t feature_size_;
  DType feature_dtype_;
  int64_t samples_per_shard_;
  std::vector<int64_t> ids_, offsets_{0};
  std::vector<uint8_t> mask_, features_;
  struct ShardInfo {
    std::string file;
    int64_t samples, tokens;
  };
  std::vector<ShardInfo> written_;
  std::map<std::string, std::string> metadata_;
};

// data.source 'shards': the shards in job.data.shards_dir, the drafter config from its manifest's
// metadata, the target's tensors from its target.safetensors. Other sources need the
// flashdraft-coordinator binary (an UNIMPLEMENTED error says so).
absl::StatusOr<SourceBundle> OpenShardBundle(const JobConfig& job);

}  // namespace flashdraft
