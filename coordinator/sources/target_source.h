// data.source 'target': hidden states computed online by the target model (DFLASH.md §7: no
// terabytes of shards). The chat data (JSONL, the forms of model/chat_data.h) is tokenized when the
// source opens; features are computed on demand, and ahead of demand on background threads for the
// samples the coordinator announces with Prefetch(), into a bounded cache that each Get() drains.
// Lives in its own library (LibTorch) so that the coordinator library stays torch-free.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/job_config.h"
#include "coordinator/sources/hidden_state_source.h"
#include "coordinator/sources/regeneration_cache.h"
#include "coordinator/sources/target_features.h"

namespace flashdraft {

class ChatLineReader;

struct TargetSourceOptions {
  TargetFeatureOptions target;  // the model and its features (TargetFeatureOptionsFor)
  // The chat files with their weights (data.jsonl is one file of weight 1). Their lines are
  // numbered through the files in order: file 2's first line follows file 1's last.
  std::vector<DataSourceConfig> data;
  uint64_t seed = 0;        // train.seed: the lines a fractional weight keeps
  std::string tokenizer;    // empty: <target.target_dir>/tokenizer.json
  bool regenerate = false;  // assistant turns become the target's greedy answers at open
  int64_t max_new_tokens = 256;
  ChatRenderOptions chat;  // data.enable_thinking, data.system_prompt
  // With regenerate: the file the replies are kept in (regeneration_cache.h), so that opening
  // the same job again reads them instead of answering every prompt again. Empty: not kept.
  std::string regeneration_cache;
  // With regenerate: the chats are not answered here but by target feeders, through
  // DeferredReplies, before the first step is planned.
  bool defer_regeneration = false;
  int threads = 1;          // background forward threads
  size_t max_cached = 256;  // samples computed ahead at most
};

class TargetModelSource : public HiddenStateSource, public DeferredReplies {
 public:
  static absl::StatusOr<std::unique_ptr<TargetModelSource>> Open(const TargetSourceOptions& o);
  ~TargetModelSource() override;

  uint64_t num_samples() const override { return samples_.size(); }
  int64_t feature_size() const override { return features_->feature_size(); }
  DType feature_dtype() const override { return options_.target.feature_dtype; }
  int64_t teacher_size() const override { return features_->teacher_size(); }
  int64_t SampleLength(uint64_t index) const override {
    return static_cast<int64_t>(ids_[samples_[index]].size());
  }
  absl::StatusOr<Sample> Get(uint64_t index) const ABSL_LOCKS_EXCLUDED(mu_) override;
  absl::StatusOr<Sample> GetTokens(uint64_t index) const override;
  void Prefetch(const std::vector<uint64_t>& indices) const ABSL_LOCKS_EXCLUDED(mu_) override;

  // DeferredReplies (options.defer_regeneration). Called by one thread, before anything plans or
  // asks for a sample: the samples they complete are not guarded.
  std::vector<Line> TakePending() override;
  size_t pending_lines() const { return pending_.size(); }
  int64_t max_new_tokens() const override { return options_.max_new_tokens; }
  const ChatRenderOptions& chat_options() const override { return options_.chat; }
  absl::Status Complete(int64_t line_no, std::vector<int64_t> ids,
                        std::vector<int64_t> mask) override;

  const std::vector<int>& layer_ids() const { return features_->layer_ids(); }
  const TargetModel& model() const { return features_->model(); }
  // Samples computed so far (on demand and ahead), for tests and metrics.
  uint64_t computed() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Reads and tokenizes options_.data into ids_ and masks_ (regenerating replies with
  // data.regenerate), then makes the samples of the weights; an error names the file and line.
  absl::Status Tokenize();
  // One file of options_.data, its lines numbered from `first_line_no`; returns its line count.
  absl::StatusOr<int64_t> TokenizeFile(const std::string& path, int64_t first_line_no,
                                       ChatLineReader& reader);
  // samples_ from the lines of each file, `lines[k]` = [first, end) in ids_ for options_.data[k].
  void WeighSamples(const std::vector<std::pair<uint64_t, uint64_t>>& lines);
  // One data line into `ids` and `mask`, regenerated (and kept in cache_, or read from it) when
  // the job regenerates and the line is a chat; left empty, pending, when feeders regenerate it.
  absl::Status ParseLine(ChatLineReader& reader, const std::string& line, int64_t line_no,
                         std::vector<int64_t>& ids, std::vector<int64_t>& mask);
  // Keeps a regenerated line in cache_; a cache that fails to write is dropped (only an
  // optimisation: the job goes on).
  void Keep(int64_t line_no, const std::vector<int64_t>& ids, const std::vector<int64_t>& mask);
  std::string TokenizerPath() const {
    return options_.tokenizer.empty() ? options_.target.target_dir + "/tokenizer.json"
                                      : options_.tokenizer;
  }
  // The cache of options_.regeneration_cache for this target and data (null: none).
  absl::StatusOr<std::unique_ptr<RegenerationCache>> OpenRegenerationCache() const;
  TargetModelSource() = default;
  absl::StatusOr<std::vector<uint8_t>> Compute(uint64_t index) const;
  void BackgroundLoop() const ABSL_LOCKS_EXCLUDED(mu_);
  // What a background thread waits for: the stop, or an announced sample and room in the cache.
  bool WorkOrStopLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  TargetSourceOptions options_;
  std::unique_ptr<TargetFeatures> features_;
  std::vector<std::vector<int64_t>> ids_, masks_;  // one per data line
  std::vector<uint64_t> samples_;                  // each sample's line in ids_, by weight
  std::unique_ptr<RegenerationCache> cache_;  // null: replies not kept (or nothing regenerated)
  struct PendingLine {
    uint64_t index = 0;  // in ids_
    std::string text;    // until TakePending
  };
  std::map<int64_t, PendingLine> pending_;  // by line number: the feeders' to regenerate

  mutable absl::Mutex mu_;
  mutable std::deque<uint64_t> queue_ ABSL_GUARDED_BY(mu_);  // announced, not yet started
  mutable std::map<uint64_t, std::vector<uint8_t>> ready_ ABSL_GUARDED_BY(mu_);
  mutable std::set<uint64_t> running_ ABSL_GUARDED_BY(mu_);
  mutable uint64_t computed_ ABSL_GUARDED_BY(mu_) = 0;
  mutable bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Started by Open, joined by the destructor (the threads themselves do not touch it).
  std::vector<std::thread> threads_;
};

// The SourceBundle of a job with data.source 'target' (writes the frozen embedding / lm_head to
// <output_dir>/target.safetensors for FetchTensors); for 'shards' jobs it returns an error.
absl::StatusOr<SourceBundle> OpenTargetSource(const JobConfig& job);

}  // namespace flashdraft
