#include "coordinator/initial_weights.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "model/drafter.h"
#include "model/export.h"

namespace flashdraft {

namespace {

// "[sliding_attention, full_attention] with sliding_window 2048", or "all full_attention".
std::string LayerTypesText(const DrafterModelConfig& c) {
  if (c.layer_types.empty()) return "all full_attention";
  return absl::StrCat("[", absl::StrJoin(c.layer_types, ", "), "] with sliding_window ",
                      c.sliding_window);
}

// The published drafter's shapes against the job's: every field that sizes a weight must agree.
absl::Status CheckFits(const DrafterModelConfig& from, const DrafterModelConfig& job,
                       const std::string& source) {
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"hidden_size", {from.hidden_size, job.hidden_size}},
      {"intermediate_size", {from.intermediate_size, job.intermediate_size}},
      {"num_hidden_layers", {from.num_hidden_layers, job.num_hidden_layers}},
      {"num_attention_heads", {from.num_attention_heads, job.num_attention_heads}},
      {"num_key_value_heads", {from.num_key_value_heads, job.num_key_value_heads}},
      {"head_dim", {from.head_dim, job.head_dim}},
      {"vocab_size", {from.vocab_size, job.vocab_size}},
      {"number of target layers (target_layer_ids)",
       {static_cast<int64_t>(from.target_layer_ids.size()),
        static_cast<int64_t>(job.target_layer_ids.size())}},
  };
  for (const auto& [field, values] : fields) {
    if (values.first != values.second) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": ", field, " is ", values.first, " but the job's drafter has ", values.second,
          " (drafter.init_from must be a drafter of the same shape, for the same target)"));
    }
  }
  if (from.layer_types != job.layer_types || from.sliding_window != job.sliding_window) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": its layers are ", LayerTypesText(from), " but the job's drafter has ",
        LayerTypesText(job),
        " (set drafter.layer_types and drafter.sliding_window as the drafter has them)"));
  }
  if (from.target_layer_ids != job.target_layer_ids) {
    LOG(WARNING) << source << ": trained on target layers "
                 << absl::StrJoin(from.target_layer_ids, ",") << ", the job uses "
                 << absl::StrJoin(job.target_layer_ids, ",")
                 << ": fine-tuning starts from features it was not trained on";
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> WriteInitialWeights(const JobConfig& job,
                                                const DrafterModelConfig& config) {
  Drafter drafter(config);
  if (job.drafter.init_from.empty()) {
    drafter->InitWeights(job.train.seed);
  } else {
    const std::string& dir = job.drafter.init_from;
    FD_ASSIGN_OR_RETURN(DrafterModelConfig from, LoadDrafterConfig(dir + "/config.json"));
    FD_RETURN_IF_ERROR(CheckFits(from, config, dir + "/config.json"));
    FD_ASSIGN_OR_RETURN(auto weights, SafetensorsModel::Open(dir + "/model.safetensors"));
    FD_RETURN_IF_ERROR(LoadDrafterWeights(*drafter, *weights, /*with_frozen=*/false));
    LOG(INFO) << "the drafter starts from " << dir << " (drafter.init_from)";
  }
  const std::string path = job.output_dir + "/initial_weights.safetensors";
  FD_RETURN_IF_ERROR(WriteDrafterWeightsF32(*drafter, path));
  return path;
}

}  // namespace flashdraft
