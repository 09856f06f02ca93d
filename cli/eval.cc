#include "cli/eval.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "model/chat_data.h"
#include "model/drafter.h"
#include "model/drafter_config.h"
#include "model/generate.h"
#include "model/numeric_probe.h"
#include "model/speculative.h"
#include "model/target_model.h"

namespace flashdraft {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

struct PromptResult {
  int64_t prompt_tokens = 0;
  std::vector<int64_t> greedy;
  SpeculativeResult spec;  // its tokens, accepted lengths and τ
  double greedy_seconds = 0, speculative_seconds = 0;
  int64_t first_difference = -1;  // -1: lossless
};

std::string Piece(const Tokenizer* tokenizer, int64_t id) {
  if (tokenizer == nullptr) return "";
  return absl::StrCat(" '", tokenizer->Decode({static_cast<int32_t>(id)}), "'");
}

// One prompt through the target's greedy decoding and through speculative decoding, timed, and
// where their outputs first differ.
absl::StatusOr<PromptResult> DecodePrompt(const TargetModel& target, DrafterImpl& drafter,
                                          const std::vector<int64_t>& prompt,
                                          const SpeculativeOptions& so) {
  PromptResult r;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<int64_t>> greedy =
      GreedyGenerate(target, prompt, so.max_new_tokens, so.stop_ids);
  r.greedy_seconds = Seconds(t0);
  if (!greedy.ok()) return greedy.status();
  t0 = std::chrono::steady_clock::now();
  absl::StatusOr<SpeculativeResult> spec = SpeculativeGenerate(target, drafter, prompt, so);
  r.speculative_seconds = Seconds(t0);
  if (!spec.ok()) return spec.status();
  // z-lab's extra cycle is counted, not timed: the decode a server runs ends without it.
  if (spec->final_cycle) r.speculative_seconds -= spec->final_cycle->seconds;
  r.greedy = *std::move(greedy);
  r.spec = *std::move(spec);
  const size_t n = std::min(r.greedy.size(), r.spec.tokens.size());
  for (size_t i = 0; i < n && r.first_difference < 0; ++i) {
    if (r.greedy[i] != r.spec.tokens[i]) r.first_difference = static_cast<int64_t>(i);
  }
  if (r.first_difference < 0 && r.greedy.size() != r.spec.tokens.size()) {
    r.first_difference = static_cast<int64_t>(n);
  }
  return r;
}

// Aggregates: τ, acceptance per position and accepted lengths (SpeculativeTally); throughput of
// both decoders; the prompts whose outputs differ.
struct EvalSummary {
  EvalSummary(const std::vector<PromptResult>& results, int64_t block) : tally(block) {
    for (const PromptResult& r : results) {
      tally.Add(r.spec);
      greedy_seconds += r.greedy_seconds;
      spec_seconds += r.speculative_seconds;
      greedy_tokens += static_cast<int64_t>(r.greedy.size());
      spec_tokens += static_cast<int64_t>(r.spec.tokens.size());
      if (r.first_difference >= 0 && lossy == nullptr) lossy = &r;
      lossy_count += r.first_difference >= 0;
    }
    greedy_rate = greedy_seconds > 0 ? greedy_tokens / greedy_seconds : 0;
    spec_rate = spec_seconds > 0 ? spec_tokens / spec_seconds : 0;
    speedup = greedy_rate > 0 ? spec_rate / greedy_rate : 0;
  }

  SpeculativeTally tally;
  double greedy_seconds = 0, spec_seconds = 0;
  int64_t greedy_tokens = 0, spec_tokens = 0;
  double greedy_rate = 0, spec_rate = 0, speedup = 0;
  const PromptResult* lossy = nullptr;  // the first prompt whose outputs differ
  int64_t lossy_count = 0;
};

nlohmann::json EvalJson(const EvalOptions& o, int64_t block,
                        const std::vector<PromptResult>& results, const EvalSummary& sum) {
  const std::vector<int64_t>& histogram = sum.tally.histogram();
  nlohmann::json j;
  j["prompts"] = results.size();
  j["block_size"] = block;
  j["max_new_tokens"] = o.max_new_tokens;
  j["enable_thinking"] = o.chat.enable_thinking;
  j["system_prompt"] = o.chat.system_prompt;
  j["tau"] = sum.tally.Tau();
  j["tau_zlab"] = sum.tally.TauZlab();
  j["tau_pooled"] = sum.tally.TauPooled();
  j["tau_sglang"] = sum.tally.TauSglang();
  j["cycles"] = sum.tally.cycles();
  j["acceptance_per_position"] = sum.tally.AcceptancePerPosition();
  j["accepted_length_histogram"] =
      std::vector<int64_t>(histogram.begin() + 1, histogram.end());  // lengths 1..B
  j["target_only"] = {{"tokens", sum.greedy_tokens},
                      {"seconds", sum.greedy_seconds},
                      {"tokens_per_second", sum.greedy_rate}};
  j["speculative"] = {{"tokens", sum.spec_tokens},
                      {"seconds", sum.spec_seconds},
                      {"tokens_per_second", sum.spec_rate}};
  j["speedup"] = sum.speedup;
  j["lossless"] = sum.lossy == nullptr;
  nlohmann::json per = nlohmann::json::array();
  for (const PromptResult& r : results) {
    per.push_back({{"prompt_tokens", r.prompt_tokens},
                   {"new_tokens", r.spec.tokens.size()},
                   {"cycles", r.spec.accepted.size()},
                   {"tau", r.spec.Tau()},
                   {"tau_zlab", r.spec.TauZlab()},
                   {"first_difference", r.first_difference}});
  }
  j["per_prompt"] = per;
  return j;
}

void PrintPerPrompt(const std::vector<PromptResult>& results) {
  std::printf("%6s %7s %10s %7s %6s %12s %12s\n", "prompt", "tokens", "new tokens", "cycles", "tau",
              "target tok/s", "spec tok/s");
  for (size_t i = 0; i < results.size(); ++i) {
    const PromptResult& r = results[i];
    std::printf("%6zu %7lld %10zu %7zu %6.2f %12.1f %12.1f%s\n", i + 1,
                static_cast<long long>(r.prompt_tokens), r.spec.tokens.size(),
                r.spec.accepted.size(), r.spec.Tau(),
                r.greedy_seconds > 0 ? r.greedy.size() / r.greedy_seconds : 0.0,
                r.speculative_seconds > 0 ? r.spec.tokens.size() / r.speculative_seconds : 0.0,
                r.first_difference >= 0 ? "  DIFFERS" : "");
  }
}

// τ over the prompts, acceptance by position and the histogram of accepted lengths.
void PrintAcceptance(const std::vector<PromptResult>& results, const SpeculativeTally& tally,
                     int64_t block) {
  std::vector<double> taus;
  for (const PromptResult& r : results) {
    if (!r.spec.accepted.empty()) taus.push_back(r.spec.Tau());
  }
  std::sort(taus.begin(), taus.end());
  std::printf("tau (mean accepted tokens per verify cycle, mean over prompts): %.2f", tally.Tau());
  if (!taus.empty()) {
    std::printf("  (per prompt: min %.2f, median %.2f, max %.2f)", taus.front(),
                taus[taus.size() / 2], taus.back());
  }
  std::printf("\n");
  std::printf(
      "the same decodes as others count them (docs/serving.md): z-lab benchmark.py %.2f, vLLM "
      "mean acceptance length / SGLang log accept len %.2f, SGLang spec_accept_length %.2f\n",
      tally.TauZlab(), tally.TauPooled(), tally.TauSglang());
  std::printf("acceptance by block position:");
  const std::vector<double> acceptance = tally.AcceptancePerPosition();
  for (size_t k = 0; k < acceptance.size(); ++k) std::printf("  %zu: %.2f", k + 1, acceptance[k]);
  std::printf("\naccepted length of %lld cycles:\n", static_cast<long long>(tally.cycles()));
  const std::vector<int64_t>& histogram = tally.histogram();
  const int64_t most = *std::max_element(histogram.begin(), histogram.end());
  for (int64_t a = 1; a <= block; ++a) {
    const int64_t n = histogram[static_cast<size_t>(a)];
    const int width = most > 0 ? static_cast<int>(40 * n / most) : 0;
    std::printf("  %3lld  %-40s %lld\n", static_cast<long long>(a),
                std::string(static_cast<size_t>(width), '#').c_str(), static_cast<long long>(n));
  }
}

void PrintEval(const EvalOptions& o, int64_t block, const std::vector<PromptResult>& results,
               const EvalSummary& sum) {
  std::printf("eval: %zu prompt(s) of %s, block size %lld, up to %lld new tokens, greedy%s\n",
              results.size(), o.prompts.c_str(), static_cast<long long>(block),
              static_cast<long long>(o.max_new_tokens), ChatOptionsKey(o.chat).c_str());
  if (o.per_prompt) PrintPerPrompt(results);
  PrintAcceptance(results, sum.tally, block);
  std::printf(
      "target only: %lld tokens in %.2f s (%.1f tok/s); speculative: %lld tokens in %.2f s "
      "(%.1f tok/s); speedup %.2fx (%d thread(s))\n",
      static_cast<long long>(sum.greedy_tokens), sum.greedy_seconds, sum.greedy_rate,
      static_cast<long long>(sum.spec_tokens), sum.spec_seconds, sum.spec_rate, sum.speedup,
      std::max(1, o.threads));
}

// The first prompt whose speculative output differs from the target's greedy one, named.
void ReportLossy(const std::vector<PromptResult>& results, const EvalSummary& sum,
                 const Tokenizer* tokenizer) {
  const size_t index = static_cast<size_t>(sum.lossy - results.data());
  const int64_t at = sum.lossy->first_difference;
  const auto token = [&](const std::vector<int64_t>& v) {
    return at < static_cast<int64_t>(v.size())
               ? absl::StrCat(v[static_cast<size_t>(at)],
                              Piece(tokenizer, v[static_cast<size_t>(at)]))
               : std::string("(ended)");
  };
  std::fprintf(stderr,
               "flashdraft eval: lossless check FAILED on %lld of %zu prompt(s): prompt %zu "
               "differs at new token %lld: the target's greedy decoding gives %s, speculative "
               "decoding %s\n",
               static_cast<long long>(sum.lossy_count), results.size(), index + 1,
               static_cast<long long>(at), token(sum.lossy->greedy).c_str(),
               token(sum.lossy->spec.tokens).c_str());
}

int Fail(const absl::Status& s) {
  std::cerr << "flashdraft eval: error: " << s.message() << "\n";
  return 1;
}

// Both decoders over every prompt, with a progress line.
absl::StatusOr<std::vector<PromptResult>> DecodePrompts(
    const TargetModel& target, DrafterImpl& drafter,
    const std::vector<std::vector<int64_t>>& prompts, const SpeculativeOptions& so) {
  std::vector<PromptResult> results;
  Progress progress =
      Progress::ForStream("eval", static_cast<double>(prompts.size()), "prompts", stderr);
  for (const std::vector<int64_t>& prompt : prompts) {
    absl::StatusOr<PromptResult> r = DecodePrompt(target, drafter, prompt, so);
    if (!r.ok()) return r.status();
    results.push_back(*std::move(r));
    progress.Update(static_cast<double>(results.size()));
  }
  progress.Finish();
  return results;
}

}  // namespace

int RunEval(const EvalOptions& o) {
  PinComputeThreads(o.threads);
  torch::NoGradGuard no_grad;
  absl::StatusOr<std::unique_ptr<TargetModel>> target = TargetModel::Load(o.target);
  if (!target.ok()) return Fail(target.status());
  absl::StatusOr<Drafter> loaded = LoadDrafterForTarget(o.drafter, **target);
  if (!loaded.ok()) return Fail(loaded.status());
  Drafter drafter = *loaded;
  // Checked before any decoding, the error naming the flag.
  absl::StatusOr<int64_t> block_size =
      DecodeBlockSize(o.block_size, drafter->config(), "--block-size");
  if (!block_size.ok()) return Fail(block_size.status());
  const int64_t block = *block_size;
  absl::StatusOr<EvalPrompts> prompts =
      LoadEvalPrompts(o.prompts, o.limit, o.target, **target, o.chat);
  if (!prompts.ok()) return Fail(prompts.status());

  SpeculativeOptions so;
  so.max_new_tokens = o.max_new_tokens;
  so.block_size = block;
  so.stop_ids = prompts->stop_ids;
  so.accept_unverified = o.accept_unverified;
  so.zlab_final_cycle = true;
  absl::StatusOr<std::vector<PromptResult>> results =
      DecodePrompts(**target, *drafter, prompts->prompts, so);
  if (!results.ok()) return Fail(results.status());
  const EvalSummary sum(*results, block);

  if (o.json || !o.json_out.empty()) {
    const nlohmann::json j = EvalJson(o, block, *results, sum);
    if (o.json) std::printf("%s\n", j.dump(2).c_str());
    if (!o.json_out.empty()) {
      if (absl::Status s = WriteFileAtomically(o.json_out, j.dump(2) + "\n"); !s.ok()) {
        return Fail(s);
      }
    }
  }
  if (!o.json) PrintEval(o, block, *results, sum);
  if (sum.lossy != nullptr) {
    ReportLossy(*results, sum, prompts->tokenizer.get());
    return 1;
  }
  if (!o.json) {
    std::printf("lossless: all %zu output(s) equal the target's own greedy decoding\n",
                results->size());
  }
  return 0;
}

}  // namespace flashdraft
