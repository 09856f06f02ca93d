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
#include "common/chat_template.h"
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
  // Elements per token of a sample's features: the feature layers (n·H), then teacher_size().
  virtual int64_t feature_size() const = 0;
  virtual DType feature_dtype() const = 0;
  // The last columns of every feature row that hold the target's final-normed last hidden state
  // (the teacher of train.loss kl / mix): H, or 0 when the source has none.
  virtual int64_t teacher_size() const { return 0; }
  // Length of sample `index` without reading its features (for packing).
  virtual int64_t SampleLength(uint64_t index) const = 0;
  virtual absl::StatusOr<Sample> Get(uint64_t index) const = 0;
  // The sample without its features (features == nullptr), for planning: ids and loss mask only.
  virtual absl::StatusOr<Sample> GetTokens(uint64_t index) const { return Get(index); }
  // A hint: these samples will be asked for soon (a source that computes features starts on them
  // in the background). Never blocks.
  virtual void Prefetch(const std::vector<uint64_t>& indices) const { (void)indices; }
};

// data.regenerate with target feeders: the data lines whose replies the feeders regenerate before
// the job plans its first step (docs/ARCHITECTURE.md, "Feeders"). Until each is Complete, the
// source cannot give those lines' samples (GetTokens fails), so nothing may plan before.
class DeferredReplies {
 public:
  struct Line {
    int64_t line_no = 0;  // 1-based, in the data file
    std::string text;
  };
  virtual ~DeferredReplies() = default;
  // The lines still to regenerate, in file order, their texts handed over (the data set's text is
  // held once): asked for once.
  virtual std::vector<Line> TakePending() = 0;
  // How they are regenerated: the job's data.max_new_tokens, and its chat options.
  virtual int64_t max_new_tokens() const = 0;
  virtual const ChatRenderOptions& chat_options() const = 0;
  // A feeder's answer for pending line `line_no`: checked (ids of the vocabulary, a 0/1 mask of
  // the same length; an error says what is wrong), truncated to the job's max_seq_len, kept in
  // the job's regenerated replies and made the line's sample.
  virtual absl::Status Complete(int64_t line_no, std::vector<int64_t> ids,
                                std::vector<int64_t> mask) = 0;
};

// A source with what the coordinator needs besides the samples.
struct SourceBundle {
  std::unique_ptr<HiddenStateSource> source;
  std::string drafter_config_json;  // the target's shape as a drafter config (model/drafter_config)
  std::string drafter_config_label;  // where it came from, for errors
  // Safetensors with the frozen embed_tokens.weight (F32) and lm_head.weight unless tied.
  std::string target_tensors_path;
  std::string label;  // the data, for errors ("DIR" or "target DIR + data FILE")
  // Into `source`: the replies feeders regenerate (null: none, or regenerated already).
  DeferredReplies* deferred_replies = nullptr;
};

}  // namespace flashdraft
