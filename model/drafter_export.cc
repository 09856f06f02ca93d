#include "model/drafter_export.h"

#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "common/status_macros.h"

namespace flashdraft {

uint16_t Bf16FromF32(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if (value != value) return 0xFFFF;  // NaN, as LibTorch's vectorized CPU conversion writes it
  const uint32_t rounding_bias = ((bits >> 16) & 1) + 0x7FFF;
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

absl::Status ExportDrafterWeights(const std::string& weights_path, const DrafterModelConfig& config,
                                  const std::string& dir) {
  FD_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsModel> weights,
                      SafetensorsModel::Open(weights_path));
  std::vector<std::vector<uint16_t>> converted;
  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");
  for (const std::string& name : weights->names()) {
    FD_ASSIGN_OR_RETURN(TensorView v, weights->GetChecked(name, DType::kF32));
    std::vector<uint16_t>& out = converted.emplace_back(v.nbytes / sizeof(float));
    const uint8_t* in = v.data;
    for (size_t i = 0; i < out.size(); ++i) {
      float f;
      std::memcpy(&f, in + i * sizeof(float), sizeof(f));
      out[i] = Bf16FromF32(f);
    }
    FD_RETURN_IF_ERROR(
        writer.Add(name, DType::kBF16, v.shape, out.data(), out.size() * sizeof(uint16_t)));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  FD_RETURN_IF_ERROR(writer.Write(dir + "/model.safetensors"));
  return WriteFileAtomically(dir + "/config.json", DrafterConfigToJson(config));
}

absl::Status ExportCheckpoint(const std::string& checkpoint_dir, const std::string& dir) {
  const std::string config_path = checkpoint_dir + "/config.json";
  if (!std::filesystem::exists(config_path)) {
    return absl::NotFoundError(
        absl::StrCat(config_path, " not found: ", checkpoint_dir,
                     " is not a checkpoint directory (step-N under the job's checkpoint.dir), or "
                     "one written before checkpoints carried the drafter's config"));
  }
  FD_ASSIGN_OR_RETURN(DrafterModelConfig config, LoadDrafterConfig(config_path));
  return ExportDrafterWeights(checkpoint_dir + "/model.safetensors", config, dir);
}

}  // namespace flashdraft
