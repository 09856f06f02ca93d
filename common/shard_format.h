// The on-disk format of offline shards: a directory with manifest.json and safetensors shard
// files, each holding many samples back to back:
//   input_ids [T] I64, loss_mask [T] U8, hidden_states [T, n·H] (BF16, F16 or F32), offsets [k+1]
//   I64
// where sample i of the shard spans tokens offsets[i] .. offsets[i+1]. With "teacher_size", the
// last teacher_size columns of hidden_states are the target's final-normed last hidden state (the
// teacher of train.loss kl / mix; `flashdraft prepare --teacher`). manifest.json:
//   {"format": "flashdraft-shards-v1", "feature_size": n·H, "feature_dtype": "BF16",
//    "teacher_size": H (optional), "num_samples": N, "shards": [{"file": "shard-00000.safetensors",
//    "num_samples": k, "num_tokens": T}, ...], "metadata": {...}}
// `flashdraft prepare` and `make-shards` write it (ShardWriter); the coordinator reads it
// (coordinator/sources/shard_source.h). Shard files are mapped, not read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/safetensors.h"

namespace flashdraft {

inline constexpr const char* kShardFormat = "flashdraft-shards-v1";

struct ShardEntry {
  std::string file;  // a name in the shards' directory
  int64_t num_samples = 0;
  int64_t num_tokens = 0;  // 0 when the manifest does not say
};

struct ShardManifest {
  int64_t feature_size = 0;  // the whole row, teacher columns included
  DType feature_dtype = DType::kBF16;
  int64_t teacher_size = 0;  // of feature_size, the last columns: the teacher feature (0: none)
  std::optional<uint64_t> num_samples;  // as the manifest states it (checked against the shards)
  std::vector<ShardEntry> shards;
  // Free-form (e.g. the drafter config the shards were made for); values that are not strings
  // are kept as their JSON text.
  std::map<std::string, std::string> metadata;
};

// Parses manifest.json; errors name `path` and the key.
absl::StatusOr<ShardManifest> ParseShardManifest(const std::string& text, const std::string& path);
// <dir>/manifest.json, read and parsed.
absl::StatusOr<ShardManifest> ReadShardManifest(const std::string& dir);
// The manifest as written (num_samples: the shards' total).
std::string ShardManifestJson(const ShardManifest& manifest);

// One shard file, mapped, its tensors checked against its manifest entry (errors name the file and
// the tensor).
struct ShardFile {
  std::unique_ptr<SafetensorsFile> file;
  TensorView input_ids, loss_mask, features;
  std::vector<int64_t> offsets;  // num_samples + 1, from 0 to the token count, increasing

  int64_t num_samples() const { return static_cast<int64_t>(offsets.size()) - 1; }
};
absl::StatusOr<ShardFile> OpenShardFile(const std::string& dir, const ShardEntry& entry,
                                        int64_t feature_size, DType feature_dtype);

// "shard-00000.safetensors" for shard 0.
std::string ShardFileName(size_t index);

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
  // The last `size` of the feature_size columns are the teacher feature (manifest teacher_size).
  void SetTeacherSize(int64_t size) { teacher_size_ = size; }
  // Adopts the complete shard files an interrupted run left in the directory (shard-00000, -00001,
  // ... in order, each validated); returns how many samples they hold, to be skipped by the caller.
  absl::StatusOr<int64_t> ResumeExisting();
  absl::Status Finish();

 private:
  absl::Status FlushShard();

  std::string dir_;
  int64_t feature_size_;
  DType feature_dtype_;
  int64_t teacher_size_ = 0;
  int64_t samples_per_shard_;
  std::vector<int64_t> ids_, offsets_{0};
  std::vector<uint8_t> mask_, features_;
  std::vector<ShardEntry> written_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace flashdraft
