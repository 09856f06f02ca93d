#include "coordinator/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/chunk_wire.h"
#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "common/safetensors.h"
#include "common/status_macros.h"

namespace flashdraft {
namespace {

namespace fs = std::filesystem;

constexpr char kModelFile[] = "model.safetensors";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kManifestFile[] = "checkpoint.json";
constexpr char kConfigFile[] = "config.json";

std::string StepDirName(uint64_t completed_steps) {
  return absl::StrFormat("step-%08d", completed_steps);
}

// Completed steps of a directory named step-N, or nullopt for anything else (step-N.tmp, ...).
std::optional<uint64_t> StepOfDir(const std::string& name) {
  uint64_t step;
  if (!absl::StartsWith(name, "step-") || !absl::SimpleAtoi(name.substr(5), &step)) {
    return std::nullopt;
  }
  return step;
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return absl::InternalError(absl::StrCat(dir, ": cannot open: ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat(dir, ": fsync failed"));
  return absl::OkStatus();
}

// CRC-32C of a whole file, read in blocks (checkpoints can be many GB: never whole in memory).
absl::StatusOr<uint32_t> FileCrc32c(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::vector<char> block(4 << 20);
  uint32_t crc = 0;
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    crc = Crc32cExtend(crc, block.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return absl::InternalError(absl::StrCat(path, ": read failed"));
  return crc;
}

// Checkpoints under `root`, oldest first.
std::vector<std::pair<uint64_t, std::string>> ListCheckpoints(const std::string& root) {
  std::vector<std::pair<uint64_t, std::string>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory()) continue;
    if (auto step = StepOfDir(entry.path().filename().string())) {
      out.emplace_back(*step, entry.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The upload's tensors into the model file ("drafter." names) and the optimizer file ("adamw.").
absl::Status SplitUpload(const std::vector<OwnedTensor>& tensors, SafetensorsWriter& model,
                         SafetensorsWriter& optimizer) {
  model.SetMetadata("format", "pt");
  optimizer.SetMetadata("format", "pt");
  for (const OwnedTensor& t : tensors) {
    const std::string& name = t.spec.name;
    if (absl::StartsWith(name, kDrafterWeightPrefix)) {
      FD_RETURN_IF_ERROR(model.Add(name.substr(std::strlen(kDrafterWeightPrefix)), t.spec.dtype,
                                   t.spec.shape, t.bytes.data(), t.bytes.size()));
    } else if (absl::StartsWith(name, kOptimizerStatePrefix)) {
      FD_RETURN_IF_ERROR(optimizer.Add(name.substr(std::strlen(kOptimizerStatePrefix)),
                                       t.spec.dtype, t.spec.shape, t.bytes.data(), t.bytes.size()));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint upload: tensor '", name,
                                                     "' is neither '", kDrafterWeightPrefix,
                                                     "' nor '", kOptimizerStatePrefix, "'"));
    }
  }
  return absl::OkStatus();
}

// Writes the model and optimizer files into `dir`; their CRC32C by file name. A large drafter's
// state takes a while to write: the log says how far it is every 10 s.
absl::StatusOr<nlohmann::json> WriteStateFiles(const std::string& dir, const std::string& label,
                                               const SafetensorsWriter& model,
                                               const SafetensorsWriter& optimizer, double total) {
  nlohmann::json files = nlohmann::json::object();
  Progress progress = Progress::ForLog(absl::StrCat("checkpoint ", label), total, "B");
  double before = 0;
  for (const auto& [file, writer] :
       {std::pair<const char*, const SafetensorsWriter*>{kModelFile, &model},
        {kOptimizerFile, &optimizer}}) {
    uint64_t bytes = 0;
    uint32_t crc = 0;
    FD_RETURN_IF_ERROR(writer->Write(
        dir + "/" + file,
        [&](size_t written) { progress.Update(before + static_cast<double>(written)); }, &bytes,
        &crc));
    before += static_cast<double>(bytes);
    files[file] = crc;
  }
  progress.Finish();
  return files;
}

}  // namespace

CheckpointStore::CheckpointStore(std::string root, int keep_last, std::string job,
                                 std::string drafter_config_json)
    : root_(std::move(root)),
      keep_last_(std::max(1, keep_last)),
      job_(std::move(job)),
      drafter_config_json_(std::move(drafter_config_json)) {}

std::vector<std::string> CheckpointStore::Existing() const {
  std::vector<std::string> out;
  for (const auto& [step, dir] : ListCheckpoints(root_)) out.push_back(dir);
  return out;
}

absl::StatusOr<CheckpointInfo> CheckpointStore::Write(
    uint64_t completed_steps, const std::vector<OwnedTensor>& tensors, const std::string& numerics,
    const std::vector<std::string>& keep_also) const {
  SafetensorsWriter model, optimizer;
  FD_RETURN_IF_ERROR(SplitUpload(tensors, model, optimizer));
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", root_, ": ", ec.message()));
  const std::string final_dir = root_ + "/" + StepDirName(completed_steps);
  const std::string tmp_dir = final_dir + ".tmp";
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", tmp_dir, ": ", ec.message()));
  double total = 0;
  for (const OwnedTensor& t : tensors) total += static_cast<double>(t.bytes.size());
  FD_ASSIGN_OR_RETURN(nlohmann::json files, WriteStateFiles(tmp_dir, StepDirName(completed_steps),
                                                            model, optimizer, total));
  if (!drafter_config_json_.empty()) {
    FD_RETURN_IF_ERROR(WriteFileAtomically(tmp_dir + "/" + kConfigFile, drafter_config_json_));
    files[kConfigFile] = Crc32c(drafter_config_json_.data(), drafter_config_json_.size());
  }
  nlohmann::json manifest = {
      {"format", 1}, {"completed_steps", completed_steps}, {"job", job_}, {"files", files}};
  if (!numerics.empty()) {
    manifest["numerics"] = nlohmann::json::parse(numerics, nullptr, /*allow_exceptions=*/false);
    if (!manifest["numerics"].is_object()) {
      return absl::InvalidArgumentError("checkpoint numerics: not a JSON object");
    }
  }
  FD_RETURN_IF_ERROR(WriteFileAtomically(tmp_dir + "/" + kManifestFile, manifest.dump(2) + "\n"));
  fs::remove_all(final_dir, ec);  // a checkpoint of the same step from an earlier run
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp_dir, " to ", final_dir, ": ", ec.message()));
  }
  FD_RETURN_IF_ERROR(SyncDirectory(root_));
  Prune(keep_also);
  return CheckpointInfo{completed_steps,
                        final_dir,
                        final_dir + "/" + kModelFile,
                        final_dir + "/" + kOptimizerFile,
                        job_,
                        numerics};
}

void CheckpointStore::Prune(const std::vector<std::string>& keep_also) const {
  std::vector<std::pair<uint64_t, std::string>> all = ListCheckpoints(root_);
  std::error_code ec;
  // Compared as paths, not strings: Write names a checkpoint root_ + "/step-N", which differs
  // from the listing's name when checkpoint.dir ends in "/".
  std::vector<fs::path> kept;
  for (const std::string& k : keep_also) kept.push_back(fs::path(k).lexically_normal());
  for (size_t i = 0; i + keep_last_ < all.size(); ++i) {
    const fs::path dir = fs::path(all[i].second).lexically_normal();
    if (std::find(kept.begin(), kept.end(), dir) == kept.end()) fs::remove_all(dir, ec);
  }
}

absl::StatusOr<std::optional<CheckpointInfo>> CheckpointStore::Latest() const {
  std::vector<std::pair<uint64_t, std::string>> all = ListCheckpoints(root_);
  if (all.empty()) return std::optional<CheckpointInfo>();
  FD_ASSIGN_OR_RETURN(CheckpointInfo info, OpenCheckpoint(all.back().second));
  return std::optional<CheckpointInfo>(std::move(info));
}

absl::StatusOr<CheckpointInfo> OpenCheckpoint(const std::string& path) {
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::optional<uint64_t> step = StepOfDir(fs::path(dir).filename().string());
  if (!step.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": not a checkpoint directory (step-N under the job's checkpoint.dir)"));
  }
  const std::string manifest_path = dir + "/" + kManifestFile;
  FD_ASSIGN_OR_RETURN(const std::string text, ReadFile(manifest_path));
  nlohmann::json manifest = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object() || !manifest.contains("completed_steps") ||
      !manifest["completed_steps"].is_number_unsigned() || !manifest.contains("files") ||
      !manifest["files"].is_object()) {
    return absl::DataLossError(absl::StrCat(manifest_path, ": not a checkpoint manifest"));
  }
  if (manifest["completed_steps"].get<uint64_t>() != *step) {
    return absl::DataLossError(absl::StrCat(manifest_path, ": completed_steps ",
                                            manifest["completed_steps"].dump(),
                                            " does not match the directory's ", *step));
  }
  for (const char* file : {kModelFile, kOptimizerFile, kConfigFile}) {
    const std::string path = dir + "/" + file;
    if (file == kConfigFile && !manifest["files"].contains(file)) continue;  // optional
    if (!manifest["files"].contains(file) || !manifest["files"][file].is_number_unsigned()) {
      return absl::DataLossError(absl::StrCat(manifest_path, ": no CRC for ", file));
    }
    FD_ASSIGN_OR_RETURN(const uint32_t crc, FileCrc32c(path));
    if (crc != manifest["files"][file].get<uint64_t>()) {
      return absl::DataLossError(absl::StrCat(path, ": CRC-32C ", crc, " does not match ",
                                              manifest_path, " (", manifest["files"][file].dump(),
                                              "): the checkpoint is damaged"));
    }
  }
  const std::string job = manifest.contains("job") && manifest["job"].is_string()
                              ? manifest["job"].get<std::string>()
                              : std::string();
  // Optional (older checkpoints have none); its fields are checked by whoever reads them.
  if (manifest.contains("numerics") && !manifest["numerics"].is_object()) {
    return absl::DataLossError(absl::StrCat(manifest_path, ": \"numerics\" is not an object"));
  }
  const std::string numerics =
      manifest.contains("numerics") ? manifest["numerics"].dump() : std::string();
  return CheckpointInfo{*step, dir,     dir + "/" + kModelFile, dir + "/" + kOptimizerFile,
                        job,   numerics};
}

bool CheckpointCadence::Due(int64_t step) const {
  if (every_steps_ > 0 && (step + 1) % every_steps_ == 0) return true;
  if (every_seconds_ > 0 && clock_.Now() - last_ >= every_seconds_) return true;
  return step + 1 == total_steps_;
}

}  // namespace flashdraft
