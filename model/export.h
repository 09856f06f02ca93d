// The drafter in the format SGLang, vLLM and the z-lab code load (DFLASH.md §6): a folder with
// config.json (architectures DFlashDraftModel, dflash_config) and model.safetensors holding the
// trained parameters under their HF names in BF16. The target's embedding and lm_head are not
// saved.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "model/drafter.h"

namespace flashdraft {

absl::Status ExportDrafter(DrafterImpl& drafter, const std::string& dir);

// The trainable parameters as they are (F32) under their parameter names, one safetensors file
// written atomically: the weights training starts from (coordinator/initial_weights.h).
absl::Status WriteDrafterWeightsF32(DrafterImpl& drafter, const std::string& path);

}  // namespace flashdraft
