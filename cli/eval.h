// `flashdraft eval`: the trained drafter run the way a server runs it (DFLASH.md §5) — greedy
// speculative decoding on the target with its KV cache — over a file of prompts, against plain
// greedy decoding of the target on the same machine. Reports τ (mean accepted tokens per verify
// cycle, per prompt and overall: the mean over prompts), the acceptance rate at each block
// position, the histogram of accepted lengths, and target-only vs speculative tokens/s. The
// lossless check: every prompt's output must equal the target's own greedy output, or the command
// fails naming the first differing token.
#pragma once

#include <cstdint>
#include <string>

#include "common/chat_template.h"

namespace flashdraft {

struct EvalOptions {
  std::string target;   // Hugging Face folder (its tokenizer.json renders chat prompts)
  std::string drafter;  // exported drafter folder: config.json + model.safetensors
  std::string prompts;  // JSONL in the forms `prepare` reads
  int64_t max_new_tokens = 128;
  int64_t block_size = 0;  // 0: the drafter's
  int64_t limit = 0;       // the first N prompts; 0: all
  ChatRenderOptions chat;  // how chat prompts are rendered (as the job trained on them)
  // Intra-op threads, the same for both decoders. 1 by default: decoding a token is a chain of
  // small operations, which more threads on a small model only slow down.
  int threads = 1;
  bool json = false;
  std::string json_out;     // also write the JSON here (for `flashdraft report --eval`)
  bool per_prompt = false;  // the table of every prompt (JSON always has it)
  // Fault injection for the lossless check's own test (FLASHDRAFT_EVAL_FAULT=accept-drafts): the
  // drafts are accepted unverified, as a broken server would.
  bool accept_unverified = false;
};

// Exit code: 0 lossless, 1 an error or a lossless-check failure.
int RunEval(const EvalOptions& options);

}  // namespace flashdraft
