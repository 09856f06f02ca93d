// Greedy speculative decoding with a DFlash drafter, as a server runs it (DFLASH.md §5): the
// target prefills the prompt with its KV cache and gives the first token; then each cycle the
// drafter proposes a block from the target's features of every accepted position, the target
// verifies the block in one forward pass, the longest agreeing prefix plus the target's own next
// token is accepted, and both caches keep only the accepted positions. The output must equal
// plain greedy decoding of the target (the lossless check of `flashdraft eval`).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat_template.h"
#include "common/tokenizer.h"
#include "model/drafter.h"
#include "model/target_model.h"

namespace flashdraft {

struct SpeculativeOptions {
  int64_t max_new_tokens = 128;
  int64_t block_size = 0;  // 0: the drafter's; at most the drafter's
  std::vector<int64_t> stop_ids;
  // Fault injection (testing the lossless check): every draft is accepted without verification.
  bool accept_unverified = false;
  // Also run the verify cycle z-lab's benchmark.py runs past this decode's end (FinalCycle).
  bool zlab_final_cycle = false;
};

// The cycle z-lab's dflash_generate runs after a decode that ends here without it: its loop runs
// while fewer than max_new_tokens + 1 tokens exist and checks for stop tokens only after a cycle,
// so it verifies once more when the cycles landed exactly on max_new_tokens without a stop token,
// and once when the prefill's token ended the decode (a stop token, or max_new_tokens 1). The
// cycle's tokens are not kept.
struct FinalCycle {
  int64_t accepted = 0;  // 1 .. block size
  double seconds = 0;    // its wall time, which the decode's timing should leave out
};

struct SpeculativeResult {
  std::vector<int64_t> tokens;  // the new tokens, a stop token included, as GreedyGenerate's
  // Per verify cycle: the tokens it accepted, 1 (the target's own) .. block size.
  std::vector<int64_t> accepted;
  // With SpeculativeOptions::zlab_final_cycle, where z-lab runs one more cycle.
  std::optional<FinalCycle> final_cycle;
  // The mean of `accepted` (τ of this prompt); 0 without cycles.
  double Tau() const;
  // τ as z-lab's benchmark.py counts this prompt: `accepted` and the final cycle.
  double TauZlab() const;
};

// The block size a decode uses: `requested` (0: the drafter's own), which must be in 2 .. the
// drafter's; the error names `what` (the flag or field that asked for it).
absl::StatusOr<int64_t> DecodeBlockSize(int64_t requested, const DrafterModelConfig& drafter,
                                        const std::string& what = "block size");

// The figures of many prompts' results, as `flashdraft eval` prints them and the coordinator's
// evaluation records them: τ as the mean over the prompts that had a verify cycle, the histogram of
// accepted lengths 1 .. B, and per block position k = 1 .. B-1 the cycles whose draft token k was
// accepted (a cycle that accepted a tokens accepted the drafts at positions 1 .. a-1).
class SpeculativeTally {
 public:
  explicit SpeculativeTally(int64_t block_size);
  void Add(const SpeculativeResult& result);

  int64_t prompts() const { return prompts_; }
  int64_t cycles() const { return cycles_; }
  double Tau() const { return prompts_with_cycles_ > 0 ? tau_sum_ / prompts_with_cycles_ : 0; }
  // The same figure as the references count it, on the same decodes (docs/serving.md):
  // z-lab's benchmark.py: the mean over prompts of SpeculativeResult::TauZlab (needs the decodes'
  // final cycles).
  double TauZlab() const { return prompts_zlab_ > 0 ? tau_zlab_sum_ / prompts_zlab_ : 0; }
  // Pooled over all cycles, 1 + accepted drafts / drafts: vLLM's mean acceptance length and the
  // "accept len" of SGLang's log.
  double TauPooled() const {
    return cycles_ > 0 ? 1.0 + static_cast<double>(accepted_tokens_) / cycles_ : 0;
  }
  // SGLang's per-request spec_accept_length, completion tokens / verify cycles (the prefill's
  // token counted, the last cycle cut at max_new_tokens), as a mean over prompts.
  double TauSglang() const {
    return prompts_with_cycles_ > 0 ? tau_sglang_sum_ / prompts_with_cycles_ : 0;
  }
  // [a] = the cycles that accepted a tokens, a = 1 .. B (index 0 unused).
  const std::vector<int64_t>& histogram() const { return histogram_; }
  // [k-1] = the cycles that accepted the draft token at position k, k = 1 .. B-1.
  std::vector<int64_t> AcceptedPerPosition() const;
  // The same as a share of all cycles (0 without cycles).
  std::vector<double> AcceptancePerPosition() const;
  // vLLM's counters: drafted tokens (B-1 per cycle) and the drafted tokens accepted.
  int64_t draft_tokens() const { return cycles_ * (block_size_ - 1); }
  int64_t accepted_tokens() const { return accepted_tokens_; }

 private:
  int64_t block_size_;
  int64_t prompts_ = 0, prompts_with_cycles_ = 0, prompts_zlab_ = 0, cycles_ = 0,
          accepted_tokens_ = 0;
  double tau_sum_ = 0, tau_zlab_sum_ = 0, tau_sglang_sum_ = 0;
  std::vector<int64_t> histogram_;
};

// An exported (or published) drafter folder — config.json + model.safetensors — checked against
// the target it drafts for (hidden size, vocabulary, layer ids, mask token; errors name the file
// and the field), with the target's embedding and lm_head as its frozen tensors.
absl::StatusOr<Drafter> LoadDrafterForTarget(const std::string& dir, const TargetModel& target);

// Evaluation prompts from JSONL in the forms `prepare` reads (ChatLineReader::Prompt), and the
// tokens that end an answer (<|im_end|>, <|endoftext|> when the target's tokenizer has them).
struct EvalPrompts {
  std::vector<std::vector<int64_t>> prompts;
  std::vector<int64_t> stop_ids;
  std::unique_ptr<Tokenizer> tokenizer;  // the target's; null without a tokenizer.json
};
// The first `limit` prompts (0: all); errors name the file and line.
// `chat`: how chats become prompts (a job's data.enable_thinking and data.system_prompt).
absl::StatusOr<EvalPrompts> LoadEvalPrompts(const std::string& path, int64_t limit,
                                            const std::string& target_dir,
                                            const TargetModel& target,
                                            const ChatRenderOptions& chat);

// The drafter's target_layer_ids select the target features it reads.
absl::StatusOr<SpeculativeResult> SpeculativeGenerate(const TargetModel& target,
                                                      DrafterImpl& drafter,
                                                      const std::vector<int64_t>& prompt,
                                                      const SpeculativeOptions& options);

}  // namespace flashdraft
