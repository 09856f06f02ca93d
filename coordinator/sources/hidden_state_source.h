// Where training samples come from (docs/ARCHITECTURE.md): offline shards or a target model run
// online. A sample is {input_ids, loss_mask, hidden_states [S, n·H]}; sources are random access by
// a dense sample index so that the scheduler can order them by (seed, epoch) and resume from a
// cursor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace flashdraft {

struct Sample {
  uint64_t index = 0;  // dense index in the source (0 .. num_samples-1)
  std::vector<int64_t> input_ids;
  std::vector<int64_t> loss_mask;
  DType feature_dtype = DType::kBF16;
  // [length, feature_size] row-major; points into memory the source keeps alive (a mapped shard)
  // or into `owned_features`.
  const uint8_t* features = nullptr;
  std::vector<uint8_t> owned_features;

  int64_t length() const { return static_cast<int64_t>(input_ids.size()); }
};

class HiddenStateSource {
 public:
  virtual ~HiddenStateSource() = default;
  virtual uint64_t num_samples() const = 0;
  virtual int64_t feature_size() const = 0;
  virtual DType feature_dtype() const = 0;
  // Length of sample `index` without reading its features (for packing).
  virtual int64_t SampleLength(uint64_t index) const = 0;
  virtual absl::StatusOr<Sample> Get(uint64_t index) const = 0;
  // The sample without its features (features == nullptr), for planning: ids and loss mask only.
  virtual absl::StatusOr<Sample> GetTokens(uint64_t index) const { return Get(index); }
  // A hint: these samples will be asked for soon (a source that computes features starts on them
  // in the background). Never blocks.
  virtual void Prefetch(const std::vector<uint64_t>& indices) const { (void)indices; }
};

// A source with what the coordinator needs besides the samples.
struct SourceBundle {
  std::unique_ptr<HiddenStateSource> source;
  std::string drafter_config_json;  // the target's shape as a drafter config (model/drafter_config)
  std::string drafter_config_label;  // where it came from, for errors
  // Safetensors with the frozen embed_tokens.weight (F32) and lm_head.weight unless tied.
  std::string target_tensors_path;
  std::string label;  // the data, for errors ("DIR" or "target DIR + data FILE")
};

}  // namespace flashdraft
