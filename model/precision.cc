#include "model/precision.h"

namespace flashdraft {

torch::ScalarType ComputeDtypeFromName(const std::string& name) {
  if (name == "fp32") return torch::kFloat32;
  if (name == "bf16") return torch::kBFloat16;
  return torch::ScalarType::Undefined;
}

}  // namespace flashdraft
