#include "coordinator/sources/shard_source.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace flashdraft {

absl::StatusOr<std::unique_ptr<ShardSource>> ShardSource::Open(const std::string& dir) {
  FD_ASSIGN_OR_RETURN(ShardManifest manifest, ReadShardManifest(dir));
  auto source = std::unique_ptr<ShardSource>(new ShardSource());
  source->dir_ = dir;
  source->feature_size_ = manifest.feature_size;
  source->feature_dtype_ = manifest.feature_dtype;
  source->teacher_size_ = manifest.teacher_size;
  source->metadata_ = std::move(manifest.metadata);
  for (const ShardEntry& entry : manifest.shards) {
    FD_ASSIGN_OR_RETURN(ShardFile shard,
                        OpenShardFile(dir, entry, manifest.feature_size, manifest.feature_dtype));
    for (int64_t i = 0; i < shard.num_samples(); ++i) {
      source->locations_.push_back(
          {static_cast<uint32_t>(source->shards_.size()), static_cast<uint32_t>(i)});
    }
    source->shards_.push_back(std::move(shard));
  }
  const std::string manifest_path = dir + "/manifest.json";
  if (manifest.num_samples && *manifest.num_samples != source->locations_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(manifest_path, ": says ", *manifest.num_samples,
                                                   " samples but the shards hold ",
                                                   source->locations_.size()));
  }
  if (source->locations_.empty()) {
    return absl::InvalidArgumentError(manifest_path + ": the data set is empty");
  }
  return source;
}

int64_t ShardSource::SampleLength(uint64_t index) const {
  const Location& loc = locations_[index];
  const ShardFile& s = shards_[loc.shard];
  return s.offsets[loc.local + 1] - s.offsets[loc.local];
}

absl::StatusOr<Sample> ShardSource::Get(uint64_t index) const {
  if (index >= locations_.size()) {
    return absl::OutOfRangeError(absl::StrCat(dir_, ": sample ", index, " of ", locations_.size()));
  }
  const Location& loc = locations_[index];
  const ShardFile& s = shards_[loc.shard];
  const int64_t begin = s.offsets[loc.local], len = s.offsets[loc.local + 1] - begin;
  Sample sample;
  sample.index = index;
  sample.input_ids.resize(len);
  std::memcpy(sample.input_ids.data(), s.input_ids.data + begin * 8, len * 8);
  sample.loss_mask.resize(len);
  for (int64_t i = 0; i < len; ++i) sample.loss_mask[i] = s.loss_mask.data[begin + i];
  sample.feature_dtype = feature_dtype_;
  sample.features = s.features.data + begin * feature_size_ * ElementSize(feature_dtype_);
  return sample;
}

absl::StatusOr<SourceBundle> OpenShardBundle(const JobConfig& j) {
  if (j.data.source != "shards") {
    return absl::UnimplementedError(
        absl::StrCat("data.source '", j.data.source,
                     "' needs the flashdraft-coordinator binary (this build "
                     "of the coordinator library reads offline shards only)"));
  }
  SourceBundle b;
  FD_ASSIGN_OR_RETURN(std::unique_ptr<ShardSource> shards, ShardSource::Open(j.data.shards_dir));
  auto config_it = shards->metadata().find("drafter_config");
  if (config_it == shards->metadata().end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(j.data.shards_dir,
                     "/manifest.json: metadata has no \"drafter_config\" (the target's shape)"));
  }
  b.drafter_config_json = config_it->second;
  b.drafter_config_label = j.data.shards_dir + "/manifest.json";
  b.target_tensors_path = j.data.shards_dir + "/target.safetensors";
  b.label = j.data.shards_dir + ": shards";
  b.source = std::move(shards);
  return b;
}

}  // namespace flashdraft
