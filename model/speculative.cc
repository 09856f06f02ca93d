#include "model/speculative.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "model/chat_data.h"

namespace flashdraft {
namespace {

// Keeps the first `length` positions of every layer's cache.
void Crop(KvCache& cache, int64_t length) {
  for (size_t l = 0; l < cache.keys.size(); ++l) {
    cache.keys[l] = cache.keys[l].narrow(2, 0, length);
    cache.values[l] = cache.values[l].narrow(2, 0, length);
  }
}

}  // namespace

double SpeculativeResult::Tau() const {
  if (accepted.empty()) return 0;
  return static_cast<double>(std::accumulate(accepted.begin(), accepted.end(), int64_t{0})) /
         static_cast<double>(accepted.size());
}

double SpeculativeResult::TauZlab() const {
  const int64_t cycles = static_cast<int64_t>(accepted.size()) + (final_cycle ? 1 : 0);
  if (cycles == 0) return 0;
  const int64_t sum = std::accumulate(accepted.begin(), accepted.end(), int64_t{0}) +
                      (final_cycle ? final_cycle->accepted : 0);
  return static_cast<double>(sum) / static_cast<double>(cycles);
}

SpeculativeTally::SpeculativeTally(int64_t block_size)
    : block_size_(block_size),
      histogram_(static_cast<size_t>(std::max<int64_t>(block_size, 1)) + 1, 0) {}

void SpeculativeTally::Add(const SpeculativeResult& r) {
  ++prompts_;
  if (!r.accepted.empty() || r.final_cycle) {
    ++prompts_zlab_;
    tau_zlab_sum_ += r.TauZlab();
  }
  if (r.accepted.empty()) return;
  ++prompts_with_cycles_;
  tau_sum_ += r.Tau();
  tau_sglang_sum_ += static_cast<double>(r.tokens.size()) / static_cast<double>(r.accepted.size());
  for (int64_t a : r.accepted) {
    ++cycles_;
    accepted_tokens_ += a - 1;
    if (a >= 1 && a <= block_size_) ++histogram_[static_cast<size_t>(a)];
  }
}

std::vector<int64_t> SpeculativeTally::AcceptedPerPosition() const {
  std::vector<int64_t> out;
  for (int64_t k = 1; k < block_size_; ++k) {
    int64_t reached = 0;  // cycles that accepted more than k tokens
    for (int64_t a = k + 1; a <= block_size_; ++a) reached += histogram_[static_cast<size_t>(a)];
    out.push_back(reached);
  }
  return out;
}

std::vector<double> SpeculativeTally::AcceptancePerPosition() const {
  std::vector<double> out;
  for (int64_t n : AcceptedPerPosition()) {
    out.push_back(cycles_ > 0 ? static_cast<double>(n) / static_cast<double>(cycles_) : 0);
  }
  return out;
}

absl::StatusOr<Drafter> LoadDrafterForTarget(const std::string& dir, const TargetModel& target) {
  FD_ASSIGN_OR_RETURN(DrafterModelConfig d, LoadDrafterConfig(dir + "/config.json"));
  const TargetModelConfig& t = target.config();
  auto mismatch = [&](const std::string& what, int64_t drafter, int64_t target_value) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/config.json: ", what, " ", drafter,
                                                   " does not fit the target's ", target_value));
  };
  if (d.hidden_size != t.hidden_size) return mismatch("hidden_size", d.hidden_size, t.hidden_size);
  if (d.vocab_size != t.vocab_size) return mismatch("vocab_size", d.vocab_size, t.vocab_size);
  for (int id : d.target_layer_ids) {
    if (id < 0 || id >= t.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat(dir, "/config.json: target layer id ", id,
                                                     " is outside the target's ",
                                                     t.num_hidden_layers, " layers"));
    }
  }
  if (d.mask_token_id < 0 || d.mask_token_id >= t.vocab_size) {
    return mismatch("mask_token_id", d.mask_token_id, t.vocab_size);
  }
  Drafter drafter(d);
  FD_ASSIGN_OR_RETURN(auto weights, SafetensorsModel::Open(dir + "/model.safetensors"));
  FD_RETURN_IF_ERROR(LoadDrafterWeights(*drafter, *weights, /*with_frozen=*/false));
  drafter->SetFrozen(target.embed_tokens(), target.lm_head());
  drafter->eval();
  return drafter;
}

absl::StatusOr<EvalPrompts> LoadEvalPrompts(const std::string& path, int64_t limit,
                                            const std::string& target_dir,
                                            const TargetModel& target,
                                            const ChatRenderOptions& chat) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  EvalPrompts out;
  ChatLineReader reader({target_dir, "", 1, chat}, target);
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    absl::StatusOr<std::vector<int64_t>> prompt = reader.Prompt(line, target.config().vocab_size);
    if (!prompt.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": ", prompt.status().message()));
    }
    out.prompts.push_back(*std::move(prompt));
    if (limit > 0 && static_cast<int64_t>(out.prompts.size()) >= limit) break;
  }
  if (out.prompts.empty()) return absl::InvalidArgumentError(path + ": no prompts");
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromFile(target_dir + "/tokenizer.json");
  if (tokenizer.ok()) {
    for (const char* token : {"<|im_end|>", "<|endoftext|>"}) {
      if (auto id = (*tokenizer)->TokenToId(token)) out.stop_ids.push_back(*id);
    }
    out.tokenizer = *std::move(tokenizer);
  }
  return out;
}

absl::StatusOr<int64_t> DecodeBlockSize(int64_t requested, const DrafterModelConfig& d,
                                        const std::string& what) {
  const int64_t block = requested > 0 ? requested : d.block_size;
  if (block < 2 || block > d.block_size) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", block, " must be in 2 .. ",
                                                   d.block_size, " (the drafter's block size)"));
  }
  return block;
}

namespace {

// One prompt's decode state: the target's KV cache and the drafter's context of target features.
class Decode {
 public:
  Decode(const TargetModel& target, DrafterImpl& drafter, int64_t block, bool accept_unverified)
      : target_(target),
        drafter_(drafter),
        layers_(drafter.config().target_layer_ids),
        block_(block),
        accept_unverified_(accept_unverified) {}

  // Prefill: the prompt's features for the drafter; the target's first token.
  absl::StatusOr<int64_t> Prefill(const std::vector<int64_t>& prompt) {
    if (prompt.size() > 1) {
      const torch::Tensor head =
          torch::tensor(std::vector<int64_t>(prompt.begin(), prompt.end() - 1)).unsqueeze(0);
      FD_ASSIGN_OR_RETURN(TargetOutput o,
                          target_.Forward(head, layers_, /*with_logits=*/false, &cache_));
      drafter_.ExtendContext(context_, o.features);
    }
    FD_ASSIGN_OR_RETURN(TargetOutput last,
                        target_.Forward(torch::tensor({prompt.back()}).unsqueeze(0), layers_,
                                        /*with_logits=*/true, &cache_));
    drafter_.ExtendContext(context_, last.features);
    return last.logits.index({0, -1}).argmax().item<int64_t>();
  }

  // One cycle after `next`: the drafter proposes a block [next, drafts...], the target verifies it
  // in one pass; the accepted drafts and the target's own token after them, 1 .. block tokens.
  absl::StatusOr<std::vector<int64_t>> Cycle(int64_t next) {
    std::vector<int64_t> ids = {next};
    const std::vector<int64_t> drafted = drafter_.Draft(context_, next, block_);
    ids.insert(ids.end(), drafted.begin(), drafted.end());
    const int64_t start = cache_.length();
    FD_ASSIGN_OR_RETURN(TargetOutput v, target_.Forward(torch::tensor(ids).unsqueeze(0), layers_,
                                                        /*with_logits=*/true, &cache_));
    const torch::Tensor posterior = v.logits.squeeze(0).argmax(-1).contiguous();
    const int64_t* best = posterior.data_ptr<int64_t>();
    int64_t a = 0;  // drafted tokens accepted
    while (a < block_ - 1 && (ids[a + 1] == best[a] || accept_unverified_)) ++a;
    // Keep the positions of `next` and the accepted drafts; the target's token after them is next.
    Crop(cache_, start + a + 1);
    drafter_.ExtendContext(context_, v.features.narrow(1, 0, a + 1));
    std::vector<int64_t> added(ids.begin() + 1, ids.begin() + 1 + a);
    added.push_back(best[a]);
    return added;
  }

 private:
  const TargetModel& target_;
  DrafterImpl& drafter_;
  const std::vector<int>& layers_;
  const int64_t block_;
  const bool accept_unverified_;
  KvCache cache_;
  DrafterContext context_;
};

// Whether z-lab's loop verifies once more after this decode (FinalCycle says when).
bool ZlabRunsOneMore(const SpeculativeResult& r, int64_t max_new_tokens,
                     const std::function<bool(int64_t)>& is_stop) {
  // No cycle: the prefill's token was a stop token, or max_new_tokens is 1. z-lab's loop runs
  // once either way (its first stop check comes after a cycle).
  if (r.accepted.empty()) return !r.tokens.empty();
  if (std::any_of(r.tokens.begin(), r.tokens.end(), is_stop)) return false;
  const int64_t made = 1 + std::accumulate(r.accepted.begin(), r.accepted.end(), int64_t{0});
  return made == max_new_tokens;
}

}  // namespace

absl::StatusOr<SpeculativeResult> SpeculativeGenerate(const TargetModel& target,
                                                      DrafterImpl& drafter,
                                                      const std::vector<int64_t>& prompt,
                                                      const SpeculativeOptions& options) {
  FD_ASSIGN_OR_RETURN(const int64_t block, DecodeBlockSize(options.block_size, drafter.config()));
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  torch::NoGradGuard no_grad;
  const std::function<bool(int64_t)> is_stop = [&](int64_t id) {
    return std::find(options.stop_ids.begin(), options.stop_ids.end(), id) !=
           options.stop_ids.end();
  };
  SpeculativeResult result;
  if (options.max_new_tokens <= 0) return result;
  Decode decode(target, drafter, block, options.accept_unverified);
  FD_ASSIGN_OR_RETURN(int64_t next, decode.Prefill(prompt));
  result.tokens.push_back(next);
  auto done = [&] {
    return is_stop(next) || static_cast<int64_t>(result.tokens.size()) >= options.max_new_tokens;
  };
  while (!done()) {
    FD_ASSIGN_OR_RETURN(const std::vector<int64_t> added, decode.Cycle(next));
    result.accepted.push_back(static_cast<int64_t>(added.size()));
    for (int64_t token : added) {  // cut at a stop token or at max_new_tokens
      next = token;
      result.tokens.push_back(next);
      if (done()) break;
    }
  }
  if (options.zlab_final_cycle && ZlabRunsOneMore(result, options.max_new_tokens, is_stop)) {
    const auto t0 = std::chrono::steady_clock::now();
    FD_ASSIGN_OR_RETURN(const std::vector<int64_t> added, decode.Cycle(next));
    result.final_cycle =
        FinalCycle{static_cast<int64_t>(added.size()),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
  }
  return result;
}

}  // namespace flashdraft
