#include "common/shard_format.h"

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

// More samples than any shard holds; keeps offsets' size arithmetic far from overflow.
constexpr int64_t kMaxShardSamples = int64_t{1} << 40;

absl::Status ManifestError(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

std::string StringAt(const json& m, const char* key) {
  return m.contains(key) && m[key].is_string() ? m[key].get<std::string>() : "";
}

absl::Status ParseShardEntries(const json& m, const std::string& path, ShardManifest& out) {
  if (!m.contains("shards") || !m["shards"].is_array()) {
    return ManifestError(path, "missing \"shards\" list");
  }
  for (const json& entry : m["shards"]) {
    if (!entry.is_object() || !entry.contains("file") || !entry["file"].is_string() ||
        !entry.contains("num_samples") || !entry["num_samples"].is_number_unsigned() ||
        entry["num_samples"].get<uint64_t>() > static_cast<uint64_t>(kMaxShardSamples)) {
      return ManifestError(path, absl::StrCat("bad shard entry ", entry.dump()));
    }
    ShardEntry e;
    e.file = entry["file"].get<std::string>();
    if (e.file.find('/') != std::string::npos) {
      return ManifestError(path, absl::StrCat("shard file '", e.file, "' must be in the folder"));
    }
    e.num_samples = entry["num_samples"].get<int64_t>();
    if (entry.contains("num_tokens") && entry["num_tokens"].is_number_unsigned()) {
      e.num_tokens = entry["num_tokens"].get<int64_t>();
    }
    out.shards.push_back(std::move(e));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShardManifest> ParseShardManifest(const std::string& text, const std::string& path) {
  json m;
  try {
    m = json::parse(text);
  } catch (const json::exception& e) {
    return ManifestError(path, absl::StrCat("not valid JSON: ", e.what()));
  }
  if (!m.is_object() || StringAt(m, "format") != kShardFormat) {
    return ManifestError(path, absl::StrCat("\"format\" must be \"", kShardFormat, "\""));
  }
  ShardManifest out;
  if (!m.contains("feature_size") || !m["feature_size"].is_number_unsigned() ||
      m["feature_size"].get<int64_t>() < 1) {
    return ManifestError(path, "\"feature_size\" must be a positive integer");
  }
  out.feature_size = m["feature_size"].get<int64_t>();
  std::optional<DType> dtype = DTypeFromName(StringAt(m, "feature_dtype"));
  if (!dtype || (*dtype != DType::kBF16 && *dtype != DType::kF32 && *dtype != DType::kF16)) {
    return ManifestError(path, "\"feature_dtype\" must be BF16, F16 or F32");
  }
  out.feature_dtype = *dtype;
  if (m.contains("teacher_size")) {
    const json& t = m["teacher_size"];
    if (!t.is_number_unsigned() || t.get<uint64_t>() >= static_cast<uint64_t>(out.feature_size)) {
      return ManifestError(path, absl::StrCat("\"teacher_size\" ", t.dump(),
                                              " must be a non-negative integer below "
                                              "\"feature_size\" ",
                                              out.feature_size));
    }
    out.teacher_size = t.get<int64_t>();
  }
  if (m.contains("metadata") && m["metadata"].is_object()) {
    for (auto it = m["metadata"].begin(); it != m["metadata"].end(); ++it) {
      out.metadata[it.key()] =
          it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
    }
  }
  if (m.contains("num_samples") && m["num_samples"].is_number_unsigned()) {
    out.num_samples = m["num_samples"].get<uint64_t>();
  }
  FD_RETURN_IF_ERROR(ParseShardEntries(m, path, out));
  return out;
}

absl::StatusOr<ShardManifest> ReadShardManifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  FD_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseShardManifest(text, path);
}

std::string ShardManifestJson(const ShardManifest& manifest) {
  json m;
  m["format"] = kShardFormat;
  m["feature_size"] = manifest.feature_size;
  m["feature_dtype"] = std::string(DTypeName(manifest.feature_dtype));
  if (manifest.teacher_size > 0) m["teacher_size"] = manifest.teacher_size;
  int64_t total = 0;
  m["shards"] = json::array();
  for (const ShardEntry& s : manifest.shards) {
    m["shards"].push_back(
        {{"file", s.file}, {"num_samples", s.num_samples}, {"num_tokens", s.num_tokens}});
    total += s.num_samples;
  }
  m["num_samples"] = total;
  m["metadata"] = manifest.metadata;
  return m.dump(2) + "\n";
}

absl::StatusOr<ShardFile> OpenShardFile(const std::string& dir, const ShardEntry& entry,
                                        int64_t feature_size, DType feature_dtype) {
  ShardFile shard;
  FD_ASSIGN_OR_RETURN(shard.file, SafetensorsFile::Open(dir + "/" + entry.file));
  const SafetensorsFile& f = *shard.file;
  FD_ASSIGN_OR_RETURN(shard.input_ids, f.GetChecked("input_ids", DType::kI64));
  const int64_t tokens = shard.input_ids.numel();
  FD_ASSIGN_OR_RETURN(shard.loss_mask, f.GetChecked("loss_mask", DType::kU8, {tokens}));
  FD_ASSIGN_OR_RETURN(shard.features,
                      f.GetChecked("hidden_states", feature_dtype, {tokens, feature_size}));
  const int64_t samples = entry.num_samples;
  FD_ASSIGN_OR_RETURN(TensorView offsets, f.GetChecked("offsets", DType::kI64, {samples + 1}));
  shard.offsets.resize(samples + 1);
  std::memcpy(shard.offsets.data(), offsets.data, offsets.nbytes);
  if (shard.offsets.front() != 0 || shard.offsets.back() != tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.path(), ": tensor 'offsets' must start at 0 and end at ", tokens, " (the token count)"));
  }
  for (int64_t i = 0; i < samples; ++i) {
    if (shard.offsets[i + 1] <= shard.offsets[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": tensor 'offsets': sample ", i, " is empty or out of order"));
    }
  }
  return shard;
}

std::string ShardFileName(size_t index) { return absl::StrFormat("shard-%05d.safetensors", index); }

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
  const std::string name = ShardFileName(written_.size());
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
    const std::string name = ShardFileName(written_.size());
    const std::string path = dir_ + "/" + name;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) break;
    FD_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    FD_ASSIGN_OR_RETURN(TensorView ids, file->GetChecked("input_ids", DType::kI64));
    FD_ASSIGN_OR_RETURN(TensorView offsets, file->GetChecked("offsets", DType::kI64));
    FD_RETURN_IF_ERROR(
        file->GetChecked("hidden_states", feature_dtype_, {ids.numel(), feature_size_}).status());
    const int64_t n = offsets.numel() - 1;
    if (n < 1) return absl::InvalidArgumentError(path + ": tensor 'offsets' holds no sample");
    written_.push_back({name, n, ids.numel()});
    samples += n;
  }
  return samples;
}

absl::Status ShardWriter::Finish() {
  FD_RETURN_IF_ERROR(FlushShard());
  ShardManifest m;
  m.feature_size = feature_size_;
  m.feature_dtype = feature_dtype_;
  m.teacher_size = teacher_size_;
  m.shards = written_;
  m.metadata = metadata_;
  return WriteFileAtomically(dir_ + "/manifest.json", ShardManifestJson(m));
}

}  // namespace flashdraft
