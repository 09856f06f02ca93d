#include "coordinator/numerics_group.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace flashdraft {

std::string RecordNumerics(const std::optional<NumericEnv>& workers, const NumericEnv& coordinator,
                           bool mixed, const std::string& precision, int intra_op_threads) {
  nlohmann::json j = {{"coordinator", NumericEnvToJson(coordinator)},
                      {"mixed", mixed},
                      {"precision", precision},
                      {"intra_op_threads", intra_op_threads}};
  j["workers"] = workers.has_value() ? NumericEnvToJson(*workers) : nlohmann::json();
  return j.dump();
}

absl::StatusOr<RecordedNumerics> ParseRecordedNumerics(const std::string& json,
                                                       const std::string& what) {
  RecordedNumerics out;
  if (json.empty()) return out;
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::DataLossError(absl::StrCat(what, ": numerics is not an object"));
  for (const auto& [key, field] :
       {std::pair{"workers", &out.workers}, std::pair{"coordinator", &out.coordinator}}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    FD_ASSIGN_OR_RETURN(*field, NumericEnvFromJson(j[key], absl::StrCat(what, ": numerics.", key)));
  }
  if (j.contains("mixed")) {
    if (!j["mixed"].is_boolean()) {
      return absl::DataLossError(absl::StrCat(what, ": numerics.mixed is not true or false"));
    }
    out.mixed = j["mixed"].get<bool>();
  }
  return out;
}

NumericsGroup::NumericsGroup(std::string pinned_kernel, bool admit_mixed,
                             std::optional<NumericEnv> checkpoint, bool checkpoint_mixed)
    : pinned_kernel_(std::move(pinned_kernel)),
      admit_mixed_(admit_mixed),
      previous_(std::move(checkpoint)),
      previous_name_("the checkpoint's workers"),
      mixed_(checkpoint_mixed) {}

NumericsDecision NumericsGroup::Consider(const NumericEnv& env) const {
  NumericsDecision d;
  if (!pinned_kernel_.empty() && !SameBlasKernel(env.blas_core, pinned_kernel_)) {
    d.refusal =
        env.blas.empty()
            ? absl::StrCat("the job pins the OpenBLAS kernel '", pinned_kernel_,
                           "' (train.blas_kernel) and this worker's BLAS is not OpenBLAS")
            : absl::StrCat("the job pins the OpenBLAS kernel '", pinned_kernel_,
                           "' (train.blas_kernel) and this worker's OpenBLAS chose '",
                           env.blas_core, "': start it with OPENBLAS_CORETYPE=", pinned_kernel_);
    if (!env.blas.empty()) d.blas_kernel = pinned_kernel_;
    return d;
  }
  if (!group_.has_value()) {
    d.admit = d.first = true;
    if (previous_.has_value()) {
      d.differs_from_previous = absl::StrJoin(NumericDifferences(env, *previous_), "; ");
      d.previous = previous_name_;
    }
    return d;
  }
  const std::vector<std::string> differences = NumericDifferences(env, *group_);
  if (differences.empty()) {
    d.admit = true;
    return d;
  }
  const std::string what = absl::StrJoin(differences, "; ");
  if (!admit_mixed_) {
    d.refusal = absl::StrCat(
        "its numeric environment differs from the job's other workers' (", what,
        "): the job's numbers would depend on which worker computes what; start it like the "
        "others (train.blas_kernel pins the OpenBLAS kernel), or let it in without the bitwise "
        "guarantee with cluster.mixed_numerics: admit");
    return d;
  }
  d.admit = true;
  d.mixed = what;
  return d;
}

void NumericsGroup::Commit(const NumericEnv& env, const NumericsDecision& decision) {
  if (!decision.admit) return;
  if (decision.first) group_ = env;
  if (!decision.mixed.empty()) mixed_ = true;
}

void NumericsGroup::GroupEmptied() {
  if (!group_.has_value()) return;
  previous_ = std::move(group_);
  previous_name_ = "the earlier workers";
  group_.reset();
}

}  // namespace flashdraft
