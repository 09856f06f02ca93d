#include "coordinator/sources/shard_source.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace flashdraft {
namespace {

using json = nlohmann::json;

absl::Status ManifestError(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardSource>> ShardSource::Open(const std::string& dir) {
  const std::string manifest_path = dir + "/manifest.json";
  FD_ASSIGN_OR_RETURN(std::string text, ReadFile(manifest_path));
  json m;
  try {
    m = json::parse(text);
  } catch (const json::exception& e) {
    return ManifestError(manifest_path, absl::StrCat("not valid JSON: ", e.what()));
  }
  if (!m.is_object() || m.value("format", "") != kShardFormat) {
    return ManifestError(manifest_path, absl::StrCat("\"format\" must be \"", kShardFormat, "\""));
  }
  auto source = std::unique_ptr<ShardSource>(new ShardSource());
  source->dir_ = dir;
  if (!m.contains("feature_size") || !m["feature_size"].is_number_unsigned() ||
      m["feature_size"].get<int64_t>() < 1) {
    return ManifestError(manifest_path, "\"feature_size\" must be a positive integer");
  }
  source->feature_size_ = m["feature_size"].get<int64_t>();
  std::optional<DType> dtype = DTypeFromName(m.value("feature_dtype", ""));
  if (!dtype || (*dtype != DType::kBF16 && *dtype != DType::kF32 && *dtype != DType::kF16)) {
    return ManifestError(manifest_path, "\"feature_dtype\" must be BF16, F16 or F32");
  }
  source->feature_dtype_ = *dtype;
  if (m.contains("metadata") && m["metadata"].is_object()) {
    for (auto it = m["metadata"].begin(); it != m["metadata"].end(); ++it) {
      source->metadata_[it.key()] =
          it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
    }
  }
  if (!m.contains("shards") || !m["shards"].is_array()) {
    return ManifestError(manifest_path, "missing \"shards\" list");
  }
  for (const json& entry : m["shards"]) {
    if (!entry.is_object() || !entry.contains("file") || !entry["file"].is_string() ||
        !entry.contains("num_samples") || !entry["num_samples"].is_number_unsigned()) {
      return ManifestError(manifest_path, absl::StrCat("bad shard entry ", entry.dump()));
    }
    const std::string name = entry["file"].get<std::string>();
    if (name.find('/') != std::string::npos) {
      return ManifestError(manifest_path,
                           absl::StrCat("shard file '", name, "' must be in the folder"));
    }
    Shard shard;
    FD_ASSIGN_OR_RETURN(shard.file, SafetensorsFile::Open(dir + "/" + name));
    const SafetensorsFile& f = *shard.file;
    FD_ASSIGN_OR_RETURN(shard.input_ids, f.GetChecked("input_ids", DType::kI64));
    const int64_t tokens = shard.input_ids.numel();
    FD_ASSIGN_OR_RETURN(shard.loss_mask, f.GetChecked("loss_mask", DType::kU8, {tokens}));
    FD_ASSIGN_OR_RETURN(shard.features, f.GetChecked("hidden_states", source->feature_dtype_,
                                                     {tokens, source->feature_size_}));
    const int64_t samples = entry["num_samples"].get<int64_t>();
    FD_ASSIGN_OR_RETURN(TensorView offsets, f.GetChecked("offsets", DType::kI64, {samples + 1}));
    shard.offsets.resize(samples + 1);
    std::memcpy(shard.offsets.data(), offsets.data, offsets.nbytes);
    if (shard.offsets.front() != 0 || shard.offsets.back() != tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": tensor 'offsets' must start at 0 and end at ", tokens,
                       " (the token count)"));
    }
    for (int64_t i = 0; i < samples; ++i) {
      if (shard.offsets[i + 1] <= shard.offsets[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat(f.path(), ": tensor 'offsets': sample ", i, " is empty or out of order"));
      }
      source->locations_.push_back(
          {static_cast<uint32_t>(source->shards_.size()), static_cast<uint32_t>(i)});
    }
    source->shards_.push_back(std::move(shard));
  }
  if (m.contains("num_samples") && m["num_samples"].is_number_unsigned() &&
      m["num_samples"].get<uint64_t>() != source->locations_.size()) {
    return ManifestError(manifest_path,
                         absl::StrCat("says ", m["num_samples"].get<uint64_t>(),
                                      " samples but the shards hold ", source->locations_.size()));
  }
  if (source->locations_.empty()) return ManifestError(manifest_path, "the data set is empty");
  return source;
}

int64_t ShardSource::SampleLength(uint64_t index) const {
  const Location& loc = locations_[index];
  const Shard& s = shards_[loc.shard];
  return s.offsets[loc.local + 1] - s.offsets[loc.local];
}

absl::StatusOr<Sample> ShardSource::Get(uint64_t index) const {
  if (index >= locations_.size()) {
    return absl::OutOfRangeError(absl::StrCat(dir_, ": sample ", index, " of ", locations_.size()));
  }
  const Location& loc = locations_[index];
  const Shard& s = shards_[loc.shard];
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

ShardWriter::ShardWriter(std::string dir, int64_t feature_size, DType feature_dtype,
                         int64_t samples_per_shard)
    : dir_(std::move(dir)),
      feature_size_(feature_size),
      feature_dtype_(feature_dtype),
      samples_per_shard_(samples_per_shard) {}

absl::Status ShardWriter::Add(const std::vector<int64_t>& input_ids,
                              const std::vector<int64_t>& loss_mask, const void* features) {
  if (input_ids.empty() || input_ids.size() != loss_mask.size()) {
    return absl::InvalidArgumentError(
        "a sample needs input_ids and a loss_mask of the same, non-zero length");
  }
  ids_.insert(ids_.end(), input_ids.begin(), input_ids.end());
  for (int64_t v : loss_mask) mask_.push_back(v != 0);
  const size_t bytes = input_ids.size() * feature_size_ * ElementSize(feature_dtype_);
  const uint8_t* f = static_cast<const uint8_t*>(features);
  features_.insert(features_.end(), f, f + bytes);
  offsets_.push_back(static_cast<int64_t>(ids_.size()));
  if (static_cast<int64_t>(offsets_.size()) - 1 >= samples_per_shard_) return FlushShard();
  return absl::OkStatus();
}

absl::Status ShardWriter::FlushShard() {
  const int64_t samples = static_cast<int64_t>(offsets_.size()) - 1;
  if (samples == 0) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  const std::string name = absl::StrFormat("shard-%05d.safetensors", written_.size());
  const int64_t tokens = static_cast<int64_t>(ids_.size());
  SafetensorsWriter w;
  FD_RETURN_IF_ERROR(w.Add("input_ids", DType::kI64, {tokens}, ids_.data(), ids_.size() * 8));
  FD_RETURN_IF_ERROR(w.Add("loss_mask", DType::kU8, {tokens}, mask_.data(), mask_.size()));
  FD_RETURN_IF_ERROR(w.Add("hidden_states", feature_dtype_, {tokens, feature_size_},
                           features_.data(), features_.size()));
  FD_RETURN_IF_ERROR(
      w.Add("offsets", DType::kI64, {samples + 1}, offsets_.data(), offsets_.size() * 8));
  FD_RETURN_IF_ERROR(w.Write(dir_ + "/" + name));
  written_.push_back({name, samples, tokens});
  ids_.clear();
  mask_.clear();
  features_.clear();
  offsets_.assign(1, 0);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ShardWriter::ResumeExisting() {
  int64_t samples = 0;
  while (true) {
    const std::string name = absl::StrFormat("shard-%05d.safetensors", written_.size());
    const std::string path = dir_ + "/" + name;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) break;
    FD_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    FD_ASSIGN_OR_RETURN(TensorView ids, file->GetChecked("input_ids", DType::kI64));
    FD_ASSIGN_OR_RETURN(TensorView offsets, file->GetChecked("offsets", DType::kI64));
    FD_RETURN_IF_ERROR(
        file->GetChecked("hidden_states", feature_dtype_, {ids.numel(), feature_size_}).status());
    const int64_t n = offsets.numel() - 1;
    written_.push_back({name, n, ids.numel()});
    samples += n;
  }
  return samples;
}

absl::Status ShardWriter::Finish() {
  FD_RETURN_IF_ERROR(FlushShard());
  json m;
  m["format"] = kShardFormat;
  m["feature_size"] = feature_size_;
  m["feature_dtype"] = std::string(DTypeName(feature_dtype_));
  int64_t total = 0;
  m["shards"] = json::array();
  for (const ShardInfo& s : written_) {
    m["shards"].push_back({{"file", s.file}, {"num_samples", s.samples}, {"num_tokens", s.tokens}});
    total += s.samples;
  }
  m["num_samples"] = total;
  m["metadata"] = metadata_;
  return WriteFileAtomically(dir_ + "/manifest.json", m.dump(2) + "\n");
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
