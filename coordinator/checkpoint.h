// Checkpoints on the local filesystem (docs/ARCHITECTURE.md CheckpointStore): a checkpoint is
// either whole or absent. Layout under the checkpoint root:
//   step-00000010/model.safetensors      the drafter's parameters (F32, parameter names)
//   step-00000010/optimizer.safetensors  AdamW state (<name>.exp_avg, <name>.exp_avg_sq, step)
//   step-00000010/config.json            the drafter's HF config (what `flashdraft export` needs)
//   step-00000010/checkpoint.json        {"format": 1, "completed_steps": 10, "job": <fingerprint>,
//                                          "files": {"model.safetensors": <crc32c>, ...},
//                                          "numerics": {...}}  (what computed it; optional)
// Written into step-N.tmp/ (every file fsynced), renamed to step-N/, the root fsynced; the newest
// `keep_last` are kept. Loading verifies every file's CRC-32C against checkpoint.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/tensor_codec.h"

namespace flashdraft {

// Upload names (CheckpointUpload in the protocol; kDrafterWeightPrefix, kOptimizerStatePrefix)
// map to files: "drafter.<name>" to <name> in model.safetensors, "adamw.<name>" to <name> in
// optimizer.safetensors; FetchTensors maps back.
struct CheckpointInfo {
  uint64_t completed_steps = 0;
  std::string dir;
  std::string model_path;      // model.safetensors
  std::string optimizer_path;  // optimizer.safetensors
  std::string job;             // the fingerprint of the job that wrote it (empty: unknown)
  // The numeric environments that computed it, as JSON ({"workers": {...}, "coordinator": {...},
  // "mixed": bool}; the coordinator's Checkpoint numerics); empty: not recorded.
  std::string numerics;
};

class CheckpointStore {
 public:
  // `job`: the writing job's fingerprint (JobFingerprint), recorded in every checkpoint.json;
  // `drafter_config_json`: written as config.json into every checkpoint (none when empty).
  CheckpointStore(std::string root, int keep_last, std::string job = "",
                  std::string drafter_config_json = "");

  // Writes the checkpoint after `completed_steps` steps from uploaded tensors (names prefixed
  // "drafter." or "adamw."; anything else is an error), then drops all but the newest keep_last
  // except the directories in `keep_also` (an evaluation still reads them; the next Write drops
  // them once they are no longer listed). `numerics`: a JSON object recorded as
  // checkpoint.json's "numerics" (none when empty).
  absl::StatusOr<CheckpointInfo> Write(uint64_t completed_steps,
                                       const std::vector<OwnedTensor>& tensors,
                                       const std::string& numerics = "",
                                       const std::vector<std::string>& keep_also = {}) const;
  // The newest checkpoint, its files verified; nullopt when there is none. A damaged one is an
  // error naming the file (it is not skipped: a checkpoint is whole or absent).
  absl::StatusOr<std::optional<CheckpointInfo>> Latest() const;

  // The step directories under the root, whole or not (a fresh run refuses to write among them).
  std::vector<std::string> Existing() const;
  const std::string& root() const { return root_; }

 private:
  // Drops all but the newest keep_last checkpoints, except the directories in `keep_also`.
  void Prune(const std::vector<std::string>& keep_also) const;

  std::string root_;
  int keep_last_;
  std::string job_;
  std::string drafter_config_json_;
};

// One checkpoint directory (step-N), every file verified against its checkpoint.json.
absl::StatusOr<CheckpointInfo> OpenCheckpoint(const std::string& dir);

// When the commit of a step also writes a checkpoint (checkpoint.every_steps, every_seconds):
// every `every_steps` steps, when `every_seconds` passed since the last checkpoint (or the start),
// always after the last step (the finished job's drafter is exported from that checkpoint), and
// when the caller stops early.
class CheckpointCadence {
 public:
  CheckpointCadence(int every_steps, double every_seconds, int64_t total_steps, const Clock& clock)
      : every_steps_(every_steps),
        every_seconds_(every_seconds),
        total_steps_(total_steps),
        clock_(clock),
        last_(clock.Now()) {}
  // Whether committing `step` (0-based) checkpoints the state after it.
  bool Due(int64_t step) const;
  // A checkpoint was taken now: the time cadence counts from here.
  void Taken() { last_ = clock_.Now(); }

 private:
  int every_steps_;
  double every_seconds_;
  int64_t total_steps_;
  const Clock& clock_;
  double last_;
};

}  // namespace flashdraft
