#include "coordinator/tensor_catalog.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace flashdraft {
namespace {

// FetchTensors requests are bounded.
constexpr size_t kMaxFetchNames = 1 << 16;

}  // namespace

absl::StatusOr<std::optional<ResumePoint>> FindResumePoint(const CheckpointStore& store,
                                                           const std::string& fingerprint,
                                                           int64_t total_steps) {
  FD_ASSIGN_OR_RETURN(std::optional<CheckpointInfo> latest, store.Latest());
  if (!latest) {
    LOG(INFO) << "checkpoint.resume: no checkpoint in " << store.root() << "; starting from step 0";
    return std::nullopt;
  }
  if (!latest->job.empty() && latest->job != fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        latest->dir, " was written by another job (fingerprint ", latest->job, ", this job's ",
        fingerprint,
        "): its target, drafter, data or optimizer settings differ; resuming would mix two runs"));
  }
  if (static_cast<int64_t>(latest->completed_steps) > total_steps) {
    return absl::InvalidArgumentError(absl::StrCat(latest->dir, " holds ", latest->completed_steps,
                                                   " completed steps, more than this job's ",
                                                   total_steps));
  }
  ResumePoint point;
  FD_ASSIGN_OR_RETURN(point.numerics,
                      ParseRecordedNumerics(latest->numerics, latest->dir + "/checkpoint.json"));
  point.checkpoint = *std::move(latest);
  return point;
}

absl::StatusOr<std::vector<FetchEntry>> TensorCatalog::Resolve(
    const std::vector<std::string>& names) const {
  std::vector<FetchEntry> out;
  if (names.empty()) {
    out.push_back({target_, "embed_tokens.weight", "embed_tokens.weight"});
    if (target_->Contains("lm_head.weight")) {
      out.push_back({target_, "lm_head.weight", "lm_head.weight"});
    }
    for (const std::string& name : weights_->names()) {
      out.push_back({weights_, name, kDrafterWeightPrefix + name});
    }
    if (optimizer_) {
      for (const std::string& name : optimizer_->names()) {
        out.push_back({optimizer_, name, kOptimizerStatePrefix + name});
      }
    }
    return out;
  }
  if (names.size() > kMaxFetchNames) {
    return absl::InvalidArgumentError(
        absl::StrCat("FetchTensors: ", names.size(), " names (at most ", kMaxFetchNames, ")"));
  }
  for (const std::string& wire_name : names) {
    std::shared_ptr<const SafetensorsModel> file = target_;
    std::string name = wire_name;
    for (const auto& [prefix, prefixed] :
         {std::pair<absl::string_view, const std::shared_ptr<const SafetensorsModel>*>{
              kDrafterWeightPrefix, &weights_},
          {kOptimizerStatePrefix, &optimizer_}}) {
      if (absl::StartsWith(wire_name, prefix)) {
        file = *prefixed;
        name = wire_name.substr(prefix.size());
      }
    }
    // Names are looked up, never opened; errors echo the name, never a path of this host.
    if (!file) {
      return absl::NotFoundError(absl::StrCat("FetchTensors: no tensor '", Untrusted(wire_name),
                                              "' (this job did not resume from a checkpoint)"));
    }
    if (!file->Contains(name)) {
      return absl::NotFoundError(
          absl::StrCat("FetchTensors: no tensor '", Untrusted(wire_name), "'"));
    }
    out.push_back({file, name, wire_name});
  }
  return out;
}

}  // namespace flashdraft
