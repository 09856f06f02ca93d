// What identifies a target model folder without reading its weights: a SHA-256 of its config.json
// and one of its safetensors headers (each *.safetensors file's name and JSON header: every
// tensor's name, dtype, shape and offsets), in file-name order. A feeder sends it when it joins
// (proto/flashdraft/v1/feeder.proto) and the coordinator compares it with its own target's: a
// feeder that loaded another model, another size or another revision's layout is refused.
// The weights' values are not hashed (gigabytes); two checkpoints of one architecture that differ
// only in values are told apart by their config's and files' other differences, or not at all.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace flashdraft {

struct TargetFingerprintValue {
  std::string config_sha256;   // hex
  std::string tensors_sha256;  // hex
};

// Errors name the file: no config.json, no safetensors file, a header length beyond the file.
absl::StatusOr<TargetFingerprintValue> FingerprintTarget(const std::string& target_dir);

}  // namespace flashdraft
