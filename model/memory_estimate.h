// Each process's expected peak memory for a job, from the job file and the target's and drafter's
// shapes alone (no weights read): `flashdraft config check` prints it, and launch and the
// coordinator refuse a job that cannot fit, naming the largest part and what to change. Torch-free.
//
// The parts follow what the processes hold (docs/sizing.md): the coordinator the target (in fp32
// on a CPU), a buffer of its largest tensor as stored while loading, the forward's working set at
// data.max_seq_len (tiled attention and feed-forward), the frozen tensors it serves (mapped), the
// prefetched features, a received checkpoint and, with evaluation, a drafter; a worker the frozen
// embeddings, the drafter's weights, gradients and AdamW moments, the activations of
// max_anchors × block_size positions over the context, the received features and (rank 0) a
// checkpoint upload. Calibrated against measured peak RSS in tests/real_shape_test.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_config.h"
#include "model/drafter_config.h"
#include "model/target_config.h"

namespace flashdraft {

struct MemoryPart {
  std::string what;
  int64_t bytes = 0;
  bool on_gpu = false;  // device memory (target.device / worker.device cuda), not host
};

struct ProcessMemory {
  std::string process;  // "coordinator", "worker"
  std::vector<MemoryPart> parts;

  int64_t HostBytes() const;
  int64_t GpuBytes() const;
  // The largest host part (or GPU part with `gpu`).
  const MemoryPart* Largest(bool gpu = false) const;
};

// What a target feeder holds of computed features at most unless told otherwise
// (flashdraft-feeder --max-bytes).
inline constexpr int64_t kDefaultFeederMaxBytes = int64_t{1} << 30;

struct JobMemory {
  ProcessMemory coordinator;
  ProcessMemory worker;  // rank 0's (it also uploads checkpoints); other workers hold less
  ProcessMemory feeder;  // each target feeder's (empty without feeders)
  int workers = 1;
  int feeders = 0;

  // Every process of the job on one machine.
  int64_t TotalHostBytes() const;
};

// What the estimate needs beyond the job file.
struct MemoryInputs {
  DrafterModelConfig drafter;  // as the job trains it
  bool online_target = false;  // data.source target: the coordinator runs the target
  TargetModelConfig target;    // with online_target
  int64_t target_stored_bytes_per_weight = 2;  // its safetensors dtype (config.json torch_dtype)
};

// With `feeders` > 0 (an online target only) each feeder holds a replica of the target and the
// features it computed, and the coordinator holds no prefetched features.
// A feeder holds at most `feeder_max_bytes` of computed features (its --max-bytes).
JobMemory EstimateJobMemory(const JobConfig& job, const MemoryInputs& inputs, int workers,
                            int feeders = 0, int64_t feeder_max_bytes = kDefaultFeederMaxBytes);

// The inputs from the files the job names: the target's config.json (data.source target) or the
// shards' manifest.json; errors name the file.
absl::StatusOr<MemoryInputs> MemoryInputsForJob(const JobConfig& job);

// A table: each process's parts, largest first, and its total (host, and GPU where used).
std::string FormatJobMemory(const JobMemory& memory);

// Whether coordinator + `workers` workers (+ `feeders` feeders) fit `available` host bytes;
// otherwise an error naming the largest part and the fields that shrink it.
absl::Status CheckJobFits(const JobMemory& memory, int64_t available_bytes,
                          const std::string& where);

// MemAvailable of /proc/meminfo (0 when unknown).
int64_t AvailableHostMemory();

}  // namespace flashdraft
