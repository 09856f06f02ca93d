#include "coordinator/sources/target_source.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/progress.h"
#include "common/status_macros.h"
#include "common/target_fingerprint.h"
#include "glog/logging.h"
#include "model/chat_data.h"
#include "model/target_model.h"

namespace flashdraft {

absl::StatusOr<std::unique_ptr<TargetModelSource>> TargetModelSource::Open(
    const TargetSourceOptions& o) {
  std::unique_ptr<TargetModelSource> s(new TargetModelSource());
  s->options_ = o;
  FD_ASSIGN_OR_RETURN(s->features_, TargetFeatures::Open(o.target));
  // Tokenize the whole data set now: lengths are needed to plan, and bad lines surface at once.
  FD_RETURN_IF_ERROR(s->Tokenize());
  if (s->samples_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.data.size() == 1 ? o.data[0].jsonl : "the data sources", ": no samples"));
  }
  for (int i = 0; i < std::max(1, o.threads); ++i) {
    s->threads_.emplace_back([p = s.get()] { p->BackgroundLoop(); });
  }
  return s;
}

absl::StatusOr<std::unique_ptr<RegenerationCache>> TargetModelSource::OpenRegenerationCache()
    const {
  const TargetSourceOptions& o = options_;
  if (!o.regenerate || o.regeneration_cache.empty()) return nullptr;
  FD_ASSIGN_OR_RETURN(const TargetFingerprintValue fingerprint,
                      FingerprintTarget(o.target.target_dir));
  std::vector<std::string> files;
  for (const DataSourceConfig& d : o.data) files.push_back(d.jsonl);
  const std::string key = RegenerationKey(
      absl::StrCat(fingerprint.config_sha256, "/", fingerprint.tensors_sha256, " on ",
                   o.target.device, " in ", DTypeName(o.target.feature_dtype)),
      o.target.target_dir, files, o.max_new_tokens, TokenizerPath(), o.chat);
  absl::StatusOr<std::unique_ptr<RegenerationCache>> cache =
      RegenerationCache::Open(o.regeneration_cache, key);
  if (!cache.ok()) {  // only an optimisation: the replies are regenerated
    LOG(WARNING) << "regenerated replies are not kept: " << cache.status().message();
    return nullptr;
  }
  if (!(*cache)->note().empty()) LOG(WARNING) << "regenerated replies: " << (*cache)->note();
  if ((*cache)->size() > 0) {
    LOG(INFO) << "regenerated replies: " << (*cache)->size() << " line(s) read from "
              << o.regeneration_cache << " (not regenerated again)";
  }
  return std::move(*cache);
}

namespace {

// A kept reply that can stand for the line: tokens, each an id of the vocabulary, masks 0 or 1.
bool UsableReply(const std::vector<int64_t>& ids, const std::vector<int64_t>& mask, int64_t vocab) {
  if (ids.empty() || ids.size() != mask.size()) return false;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab || (mask[i] != 0 && mask[i] != 1)) return false;
  }
  return true;
}

}  // namespace

absl::Status TargetModelSource::ParseLine(ChatLineReader& reader, const std::string& line,
                                          int64_t line_no, std::vector<int64_t>& ids,
                                          std::vector<int64_t>& mask) {
  const int64_t vocab = features_->model().config().vocab_size;
  bool is_chat = false;
  FD_RETURN_IF_ERROR(reader.Parse(line, vocab, /*regenerate=*/false, ids, mask, &is_chat));
  if (!is_chat || !options_.regenerate) return absl::OkStatus();
  std::optional<RegenerationCache::Entry> kept = cache_ ? cache_->Take(line_no) : std::nullopt;
  if (kept && UsableReply(kept->ids, kept->mask, vocab)) {
    ids = std::move(kept->ids);
    mask = std::move(kept->mask);
    return absl::OkStatus();
  }
  if (kept) LOG(WARNING) << "regenerated replies: line " << line_no << " kept unusable; again";
  if (options_.defer_regeneration) {  // the feeders answer it (Complete)
    pending_[line_no] = {ids_.size(), line};
    ids.clear();
    mask.clear();
    return absl::OkStatus();
  }
  FD_RETURN_IF_ERROR(reader.Parse(line, vocab, /*regenerate=*/true, ids, mask, &is_chat));
  Keep(line_no, ids, mask);
  return absl::OkStatus();
}

void TargetModelSource::Keep(int64_t line_no, const std::vector<int64_t>& ids,
                             const std::vector<int64_t>& mask) {
  if (!cache_) return;
  if (absl::Status s = cache_->Append(line_no, ids, mask); !s.ok()) {
    LOG(WARNING) << "regenerated replies are no longer kept: " << s.message();
    cache_.reset();
  }
}

std::vector<DeferredReplies::Line> TargetModelSource::TakePending() {
  std::vector<Line> lines;
  for (auto& [line_no, p] : pending_) lines.push_back({line_no, std::move(p.text)});
  return lines;
}

absl::Status TargetModelSource::Complete(int64_t line_no, std::vector<int64_t> ids,
                                         std::vector<int64_t> mask) {
  auto it = pending_.find(line_no);
  if (it == pending_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("line ", line_no, " is not to regenerate"));
  }
  if (!UsableReply(ids, mask, features_->model().config().vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "line ", line_no, ": ", ids.size(), " token(s) and ", mask.size(),
        " mask value(s), not one of each with ids of the vocabulary and masks 0 or 1"));
  }
  Keep(line_no, ids, mask);
  if (static_cast<int64_t>(ids.size()) > options_.target.max_seq_len) {
    ids.resize(options_.target.max_seq_len);
    mask.resize(options_.target.max_seq_len);
  }
  ids_[it->second.index] = std::move(ids);
  masks_[it->second.index] = std::move(mask);
  pending_.erase(it);
  return absl::OkStatus();
}

absl::Status TargetModelSource::Tokenize() {
  const TargetSourceOptions& o = options_;
  FD_ASSIGN_OR_RETURN(cache_, OpenRegenerationCache());
  ChatLineReader reader({o.target.target_dir, o.tokenizer, o.max_new_tokens, o.chat},
                        features_->model());
  std::vector<std::pair<uint64_t, uint64_t>> lines;  // each file's, in ids_
  int64_t line_no = 0;
  for (size_t k = 0; k < o.data.size(); ++k) {
    const uint64_t first = ids_.size();
    FD_ASSIGN_OR_RETURN(const int64_t count, TokenizeFile(o.data[k].jsonl, line_no + 1, reader));
    if (o.data.size() > 1) {
      LOG(INFO) << "data.sources[" << k << "] " << o.data[k].jsonl << ": lines " << line_no + 1
                << "-" << line_no + count << " of the mix, " << ids_.size() - first
                << " sample(s), weight " << o.data[k].weight;
    }
    line_no += count;
    lines.emplace_back(first, ids_.size());
  }
  WeighSamples(lines);
  if (!pending_.empty()) {
    LOG(INFO) << pending_.size() << " line(s) to regenerate: the feeders answer them";
  } else {
    cache_.reset();  // nothing more to keep
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> TargetModelSource::TokenizeFile(const std::string& path,
                                                        int64_t first_line_no,
                                                        ChatLineReader& reader) {
  const TargetSourceOptions& o = options_;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::error_code size_error;
  const auto size = std::filesystem::file_size(path, size_error);
  const double bytes = size_error ? 0.0 : static_cast<double>(size);
  // Long with data.regenerate (the target answers every prompt): the log tells how far it is.
  Progress progress = Progress::ForLog(
      absl::StrCat(
          o.regenerate && !o.defer_regeneration ? "tokenizing and regenerating " : "tokenizing ",
          path),
      bytes, "B");
  std::string line;
  int64_t count = 0;
  std::vector<int64_t> ids, mask;
  const size_t before = ids_.size();
  while (std::getline(in, line)) {
    ++count;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (absl::Status st = ParseLine(reader, line, first_line_no + count - 1, ids, mask); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", count, ": ", st.message()));
    }
    if (static_cast<int64_t>(ids.size()) > o.target.max_seq_len) {
      ids.resize(o.target.max_seq_len);
      mask.resize(o.target.max_seq_len);
    }
    ids_.push_back(ids);
    masks_.push_back(mask);
    const std::streamoff at = in.tellg();  // -1 once the last line ended the file
    progress.Update(at < 0 ? bytes : static_cast<double>(at),
                    absl::StrCat(ids_.size() - before, " samples"));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  progress.Finish(absl::StrCat(ids_.size() - before, " samples"), /*always=*/true);
  return count;
}

void TargetModelSource::WeighSamples(const std::vector<std::pair<uint64_t, uint64_t>>& lines) {
  // The generator's outputs are fixed by the standard (unlike std::shuffle's use of them), so
  // the choice is the same on every machine.
  std::mt19937_64 rng(options_.seed ^ 0x6d6978u);  // "mix"
  for (size_t k = 0; k < lines.size(); ++k) {
    const auto [first, end] = lines[k];
    const double weight = options_.data[k].weight;
    const auto whole = static_cast<int64_t>(std::floor(weight));
    for (int64_t r = 0; r < whole; ++r) {
      for (uint64_t i = first; i < end; ++i) samples_.push_back(i);
    }
    // The fraction: that share of the file's lines, a seeded choice kept in file order.
    std::vector<uint64_t> chosen(end - first);
    std::iota(chosen.begin(), chosen.end(), first);
    const auto extra = static_cast<size_t>(std::llround((weight - whole) * chosen.size()));
    for (size_t i = 0; i < extra; ++i) {
      std::swap(chosen[i], chosen[i + rng() % (chosen.size() - i)]);
    }
    chosen.resize(extra);
    std::sort(chosen.begin(), chosen.end());
    samples_.insert(samples_.end(), chosen.begin(), chosen.end());
    if (whole == 0 && extra == 0 && end > first) {
      LOG(WARNING) << options_.data[k].jsonl << ": weight " << weight << " of " << end - first
                   << " sample(s) keeps none of them";
    }
  }
}

TargetModelSource::~TargetModelSource() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

uint64_t TargetModelSource::computed() const {
  absl::MutexLock lock(&mu_);
  return computed_;
}

absl::StatusOr<std::vector<uint8_t>> TargetModelSource::Compute(uint64_t index) const {
  return features_->Compute(ids_[samples_[index]]);
}

absl::StatusOr<Sample> TargetModelSource::GetTokens(uint64_t index) const {
  if (index >= samples_.size()) {
    return absl::OutOfRangeError(absl::StrCat("sample ", index, " of ", samples_.size()));
  }
  const uint64_t line = samples_[index];
  if (!pending_.empty() && ids_[line].empty()) {  // a pending line's sample
    return absl::FailedPreconditionError(
        absl::StrCat("sample ", index, " waits for the feeders to regenerate its replies"));
  }
  Sample s;
  s.index = index;
  s.input_ids = ids_[line];
  s.loss_mask = masks_[line];
  s.feature_dtype = options_.target.feature_dtype;
  return s;
}

absl::StatusOr<Sample> TargetModelSource::Get(uint64_t index) const {
  FD_ASSIGN_OR_RETURN(Sample s, GetTokens(index));
  {
    // Computed ahead, or being computed: take it (each announced sample is used once).
    auto not_running = [this, index]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return running_.count(index) == 0;
    };
    absl::MutexLock lock(&mu_, absl::Condition(&not_running));
    auto it = ready_.find(index);
    if (it != ready_.end()) {
      s.owned_features = std::move(it->second);
      ready_.erase(it);  // room in the cache
    } else {
      // Asked for before the background thread got to it: computed below, so not again there
      // (it would sit in the cache until the next epoch).
      queue_.erase(std::remove(queue_.begin(), queue_.end(), index), queue_.end());
    }
  }
  if (s.owned_features.empty()) {
    FD_ASSIGN_OR_RETURN(s.owned_features, Compute(index));
    absl::MutexLock lock(&mu_);
    ++computed_;
  }
  s.features = s.owned_features.data();
  return s;
}

void TargetModelSource::Prefetch(const std::vector<uint64_t>& indices) const {
  absl::MutexLock lock(&mu_);
  for (uint64_t i : indices) {
    if (i < samples_.size()) queue_.push_back(i);
  }
}

bool TargetModelSource::WorkOrStopLocked() const {
  return stop_ || (!queue_.empty() && ready_.size() + running_.size() < options_.max_cached);
}

void TargetModelSource::BackgroundLoop() const {
  while (true) {
    uint64_t index;
    {
      absl::MutexLock lock(&mu_, absl::Condition(this, &TargetModelSource::WorkOrStopLocked));
      if (stop_) return;
      index = queue_.front();
      queue_.pop_front();
      if (ready_.count(index) || running_.count(index)) continue;
      running_.insert(index);
    }
    absl::StatusOr<std::vector<uint8_t>> f = Compute(index);
    absl::MutexLock lock(&mu_);
    running_.erase(index);
    if (f.ok()) {
      ready_[index] = std::move(*f);
      ++computed_;
    } else {
      LOG(WARNING) << "target source: sample " << index << ": " << f.status().message()
                   << " (computed again on demand)";
    }
  }
}

absl::StatusOr<SourceBundle> OpenTargetSource(const JobConfig& j) {
  if (j.data.source != "target") {
    return absl::InvalidArgumentError(
        absl::StrCat("OpenTargetSource: data.source is '", j.data.source, "'"));
  }
  if (j.target.path.empty()) {
    return absl::InvalidArgumentError("data.source 'target' needs target.path");
  }
  if (j.data.jsonl.empty() && j.data.sources.empty()) {
    return absl::InvalidArgumentError("data.source 'target' needs data.jsonl or data.sources");
  }
  TargetSourceOptions o;
  o.target = TargetFeatureOptionsFor(j, j.target.path);
  o.data = j.data.sources;
  if (o.data.empty()) o.data.push_back({j.data.jsonl, 1.0});
  o.seed = j.train.seed;
  o.regenerate = j.data.regenerate;
  o.max_new_tokens = j.data.max_new_tokens;
  o.chat = {j.data.enable_thinking, j.data.system_prompt};
  if (const std::string chat = ChatOptionsKey(o.chat); !chat.empty()) {
    LOG(INFO) << "chats are rendered with" << chat.substr(1) << " (data.enable_thinking, "
              << "data.system_prompt)";
  }
  o.regeneration_cache = j.output_dir + "/regenerated-replies.bin";
  // With feeders, they compute the features and regenerate the replies: the coordinator loads
  // what the workers fetch (embedding, lm_head) and no decoder layer.
  o.defer_regeneration = j.cluster.min_feeders > 0;
  o.target.without_layers = j.cluster.min_feeders > 0;
  o.max_cached = static_cast<size_t>(std::max(1, j.data.prefetch_steps + 1) *
                                     std::max(1, j.train.global_batch_size));
  std::error_code ec;
  std::filesystem::create_directories(j.output_dir, ec);
  FD_ASSIGN_OR_RETURN(std::unique_ptr<TargetModelSource> source, TargetModelSource::Open(o));
  const TargetModel& model = source->model();
  SourceBundle b;
  b.drafter_config_json = DrafterConfigToJson(
      DrafterConfigForTarget(model.config(), source->layer_ids(), j.data.max_seq_len, -1));
  b.drafter_config_label = j.target.path + "/config.json";
  b.label = absl::StrCat("target ", j.target.path, " (online)");
  // The frozen tensors the workers fetch, as the offline path stores them.
  b.target_tensors_path = j.output_dir + "/target.safetensors";
  FD_RETURN_IF_ERROR(WriteFrozenTargetTensors(model, b.target_tensors_path));
  if (source->pending_lines() > 0) b.deferred_replies = source.get();
  b.source = std::move(source);
  return b;
}

}  // namespace flashdraft
