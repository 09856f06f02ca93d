#include "model/speculative.h"

#include <algorithm>
#include <fstream>
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

SpeculativeTally::SpeculativeTally(int64_t block_size)
    : block_size_(block_size),
      histogram_(static_cast<size_t>(std::max<int64_t>(block_size, 1)) + 1, 0) {}

void SpeculativeTally::Add(const SpeculativeResult& r) {
  ++prompts_;
  if (r.accepted.empty()) return;
  ++prompts_with_cycles_;
  tau_sum_ += r.Tau();
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
                                            const TargetModel& target) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  EvalPrompts out;
  ChatLineReader reader({target_dir, "", 1}, target);
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

absl::StatusOr<SpeculativeResult> SpeculativeGenerate(const TargetModel& target,
                                                      DrafterImpl& drafter,
                                                      const std::vector<int64_t>& prompt,
                                                      const SpeculativeOptions& options) {
  const DrafterModelConfig& d = drafter.config();
  FD_ASSIGN_OR_RETURN(const int64_t block, DecodeBlockSize(options.block_size, d));
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  torch::NoGradGuard no_grad;
  const std::vector<int>& layers = d.target_layer_ids;
  auto is_stop = [&](int64_t id) {
    return std::find(options.stop_ids.begin(), options.stop_ids.end(), id) !=
           options.stop_ids.end();
  };
  SpeculativeResult result;
  if (options.max_new_tokens <= 0) return result;

  // Prefill: the prompt's features for the drafter, the first token from the target.
  KvCache cache;
  DrafterContext context;
  const int64_t p = static_cast<int64_t>(prompt.size());
  if (p > 1) {
    const torch::Tensor head =
        torch::tensor(std::vector<int64_t>(prompt.begin(), prompt.end() - 1)).unsqueeze(0);
    FD_ASSIGN_OR_RETURN(TargetOutput o,
                        target.Forward(head, layers, /*with_logits=*/false, &cache));
    drafter.ExtendContext(context, o.features);
  }
  FD_ASSIGN_OR_RETURN(TargetOutput last,
                      target.Forward(torch::tensor({prompt.back()}).unsqueeze(0), layers,
                                     /*with_logits=*/true, &cache));
  drafter.ExtendContext(context, last.features);
  int64_t next = last.logits.index({0, -1}).argmax().item<int64_t>();
  result.tokens.push_back(next);

  while (!is_stop(next) && static_cast<int64_t>(result.tokens.size()) < options.max_new_tokens) {
    // Draft: [next, MASK...] at the position after the context.
    std::vector<int64_t> ids = {next};
    const std::vector<int64_t> drafted = drafter.Draft(context, next, block);
    ids.insert(ids.end(), drafted.begin(), drafted.end());
    // Verify: the target's argmax after each block position, in one pass over the block.
    const int64_t start = cache.length();
    FD_ASSIGN_OR_RETURN(TargetOutput v, target.Forward(torch::tensor(ids).unsqueeze(0), layers,
                                                       /*with_logits=*/true, &cache));
    const torch::Tensor posterior = v.logits.squeeze(0).argmax(-1).contiguous();
    const int64_t* best = posterior.data_ptr<int64_t>();
    int64_t a = 0;  // drafted tokens accepted
    while (a < block - 1 && (ids[a + 1] == best[a] || options.accept_unverified)) ++a;
    result.accepted.push_back(a + 1);
    // Keep the positions of `next` and the accepted drafts; the target's token after them is next.
    Crop(cache, start + a + 1);
    drafter.ExtendContext(context, v.features.narrow(1, 0, a + 1));
    for (int64_t i = 1; i <= a + 1; ++i) {
      next = i <= a ? ids[i] : best[a];
      result.tokens.push_back(next);
      if (is_stop(next) || static_cast<int64_t>(result.tokens.size()) >= options.max_new_tokens) {
        break;
      }
    }
  }
  return result;
}

}  // namespace flashdraft
