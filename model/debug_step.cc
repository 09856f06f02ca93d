#include "model/debug_step.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "model/drafter.h"
#include "model/target_model.h"
#include "model/wire_tensor.h"

namespace flashdraft {

absl::Status RunDrafterDebugStep(const DrafterStepFiles& files) {
  FD_ASSIGN_OR_RETURN(DrafterModelConfig config, LoadDrafterConfig(files.config));
  double gamma = 0;
  if (files.gamma) {
    if (!(*files.gamma > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("--gamma must be > 0, got ", *files.gamma));
    }
    gamma = *files.gamma;
  } else if (std::optional<double> g = DefaultLossDecayGamma(static_cast<int>(config.block_size))) {
    gamma = *g;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--gamma is required for block_size ",
                                                   config.block_size,
                                                   " (defaults exist for 8, 10 and 16)"));
  }
  if (!(files.ce_weight >= 0 && files.ce_weight <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ce-weight must be in [0, 1], got ", files.ce_weight));
  }
  FD_ASSIGN_OR_RETURN(auto weights, SafetensorsModel::Open(files.weights));
  FD_ASSIGN_OR_RETURN(auto batch_file, SafetensorsFile::Open(files.batch));
  FD_ASSIGN_OR_RETURN(DrafterBatch batch, LoadDrafterBatch(*batch_file, config));
  if (files.ce_weight < 1 && !batch.teacher_hidden.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(files.batch, ": --ce-weight ", files.ce_weight,
                     " (distillation) needs tensor 'teacher_hidden' [b, S, H]: the target's last "
                     "hidden state after its final norm"));
  }

  Drafter drafter(config);
  FD_RETURN_IF_ERROR(LoadDrafterWeights(*drafter, *weights));
  DrafterLossResult result = drafter->Loss(batch, gamma, std::nullopt, files.ce_weight);
  result.loss.backward();

  std::vector<torch::Tensor> keep_alive;
  SafetensorsWriter writer;
  auto add = [&](const std::string& name, torch::Tensor t) -> absl::Status {
    t = t.to(torch::kFloat32).contiguous();
    keep_alive.push_back(t);
    return writer.Add(name, DType::kF32, t.sizes().vec(), t.data_ptr(), t.nbytes());
  };
  FD_RETURN_IF_ERROR(add("loss", result.loss.detach().reshape({})));
  const std::vector<double> acc = result.SlotAccuracy();
  FD_RETURN_IF_ERROR(add("slot_accuracy", torch::tensor(acc, torch::kFloat64)));
  if (files.ce_weight < 1) {  // Σ w·KL / Σ w, the distillation term alone
    const double kl = result.weight_sum > 0 ? result.weighted_kl_sum / result.weight_sum : 0.0;
    FD_RETURN_IF_ERROR(add("kl", torch::tensor(kl, torch::kFloat64)));
  }
  for (const auto& item : drafter->named_parameters()) {
    const torch::Tensor& grad = item.value().grad();
    FD_RETURN_IF_ERROR(add(item.key(), grad.defined() ? grad : torch::zeros_like(item.value())));
  }
  return writer.Write(files.out);
}

absl::Status RunTargetFeaturesDebug(const std::string& target_dir, const std::string& ids_path,
                                    const std::vector<int>& layers, const std::string& out_path,
                                    bool dense_attention) {
  FD_ASSIGN_OR_RETURN(auto model, TargetModel::Load(target_dir));
  TargetForwardOptions options;
  options.dense_attention = dense_attention;
  model->SetForwardOptions(options);
  FD_ASSIGN_OR_RETURN(auto ids_file, SafetensorsFile::Open(ids_path));
  FD_ASSIGN_OR_RETURN(TensorView ids, ids_file->GetChecked("input_ids", DType::kI64));
  if (ids.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(ids_path, ": tensor 'input_ids': shape ",
                                                   ShapeString(ids.shape), " is not [b, S]"));
  }
  FD_ASSIGN_OR_RETURN(TargetOutput out, model->Forward(ToTorch(ids), layers, /*with_logits=*/true));
  const torch::Tensor features = out.features.to(torch::kFloat32).contiguous();
  const torch::Tensor logits = out.logits.to(torch::kFloat32).contiguous();
  SafetensorsWriter writer;
  FD_RETURN_IF_ERROR(writer.Add("hidden_states", DType::kF32, features.sizes().vec(),
                                features.data_ptr(), features.nbytes()));
  FD_RETURN_IF_ERROR(
      writer.Add("logits", DType::kF32, logits.sizes().vec(), logits.data_ptr(), logits.nbytes()));
  return writer.Write(out_path);
}

}  // namespace flashdraft
