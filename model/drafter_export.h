// The drafter's export folder (DFLASH.md §6: config.json + model.safetensors in BF16 under the
// parameter names) written without LibTorch, from the F32 parameters a checkpoint holds. The
// coordinator writes a finished job's export this way from its last checkpoint, and
// `flashdraft export` from any checkpoint.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "model/drafter_config.h"

namespace flashdraft {

// F32 -> BF16 as LibTorch's CPU conversion does: round to nearest, ties to even (a finite value
// past the largest BF16 becomes infinity); every NaN becomes 0xFFFF.
uint16_t Bf16FromF32(float value);

// `dir`/model.safetensors (every tensor of `weights_path`, which must all be F32, in BF16 under
// the same names) and `dir`/config.json (DrafterConfigToJson of `config`).
absl::Status ExportDrafterWeights(const std::string& weights_path, const DrafterModelConfig& config,
                                  const std::string& dir);

// The same from a checkpoint directory (its model.safetensors and the drafter config.json it
// carries); checkpoints written before they carried one are refused, naming the file.
absl::Status ExportCheckpoint(const std::string& checkpoint_dir, const std::string& dir);

}  // namespace flashdraft
