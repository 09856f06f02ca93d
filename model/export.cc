#include "model/export.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "common/status_macros.h"

namespace flashdraft {

absl::Status ExportDrafter(DrafterImpl& drafter, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> keep_alive;
  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");
  for (const auto& item : drafter.named_parameters()) {
    torch::Tensor t = item.value().detach().to(torch::kBFloat16).contiguous();
    keep_alive.push_back(t);
    FD_RETURN_IF_ERROR(
        writer.Add(item.key(), DType::kBF16, t.sizes().vec(), t.data_ptr(), t.nbytes()));
  }
  FD_RETURN_IF_ERROR(writer.Write(dir + "/model.safetensors"));
  return WriteFileAtomically(dir + "/config.json", DrafterConfigToJson(drafter.config()));
}

absl::Status WriteDrafterWeightsF32(DrafterImpl& drafter, const std::string& path) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> keep_alive;
  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");
  for (const auto& item : drafter.named_parameters()) {
    torch::Tensor t = item.value().detach().to(torch::kFloat32).contiguous();
    keep_alive.push_back(t);
    FD_RETURN_IF_ERROR(
        writer.Add(item.key(), DType::kF32, t.sizes().vec(), t.data_ptr(), t.nbytes()));
  }
  return writer.Write(path);
}

}  // namespace flashdraft
