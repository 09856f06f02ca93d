#include "model/export.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "common/status_macros.h"

namespace flashdraft {

namespace {

// The trainable parameters under their parameter names, converted to `type`, one file written
// atomically.
absl::Status WriteParameters(DrafterImpl& drafter, torch::ScalarType type, DType dtype,
                             const std::string& path) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> keep_alive;
  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");
  for (const auto& item : drafter.named_parameters()) {
    torch::Tensor t = item.value().detach().to(type).contiguous();
    keep_alive.push_back(t);
    FD_RETURN_IF_ERROR(writer.Add(item.key(), dtype, t.sizes().vec(), t.data_ptr(), t.nbytes()));
  }
  return writer.Write(path);
}

}  // namespace

absl::Status ExportDrafter(DrafterImpl& drafter, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  FD_RETURN_IF_ERROR(
      WriteParameters(drafter, torch::kBFloat16, DType::kBF16, dir + "/model.safetensors"));
  return WriteFileAtomically(dir + "/config.json", DrafterConfigToJson(drafter.config()));
}

absl::Status WriteDrafterWeightsF32(DrafterImpl& drafter, const std::string& path) {
  return WriteParameters(drafter, torch::kFloat32, DType::kF32, path);
}

}  // namespace flashdraft
