// `flashdraft prepare`: offline shards from a real target model. Reads chat data, one JSON object
// per line, in any of three forms:
//   {"input_ids": [...], "loss_mask": [...]}                 already tokenized
//   {"messages": [{"role": "user", "content": "..."}, ...]}    OpenAI style (+ reasoning_content)
//   {"conversations": [{"from": "human", "value": "..."}, ...]} ShareGPT style (human/gpt/system)
// Chats are rendered with the Qwen3 chat template and tokenized with the target's tokenizer.json
// (loss on the assistant turns); with --regenerate every assistant turn is first replaced by the
// target's own greedy answer. Runs the target (model/target_model.h) to get the outputs of the
// conditioning layers, and writes shards + target.safetensors (the target's embedding and lm_head)
// + manifest.json with the drafter config derived from the target.
// --import-specforge DIR instead converts SpecForge's offline DFlash samples (one torch.save dict
// per file, *.pt or *.ckpt: input_ids [S], loss_mask [S], hidden_states [S, n·H]) into shards,
// without running the target (it only provides the config, embedding and lm_head).
// --teacher adds the target's final-normed last hidden state to every row (train.loss kl / mix).
// Resumable: complete shards of an interrupted run are kept and their samples skipped.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/chat_template.h"

namespace flashdraft {

struct PrepareOptions {
  std::string target;            // Hugging Face folder
  std::string data;              // JSONL (see above)
  std::string import_specforge;  // instead of data: a folder of SpecForge torch.save samples
  std::string tokenizer;         // tokenizer.json for chat lines; empty: <target>/tokenizer.json
  bool regenerate = false;
  int64_t max_new_tokens = 512;  // per regenerated assistant turn
  ChatRenderOptions chat;        // thinking mode and system prompt of chat lines
  std::string out;
  std::vector<int> layer_ids;  // empty: DFLASH.md §2 formula with num_features
  int num_features = 5;
  int64_t mask_token_id = -1;  // -1: the last row of the embedding table
  int64_t max_seq_len = 3072;
  int64_t samples_per_shard = 256;
  bool skip_bad_lines = false;    // otherwise the first bad line is fatal
  bool float32_features = false;  // default BF16
  // Each row also holds the target's final-normed last hidden state (manifest teacher_size: H),
  // for train.loss kl / mix. --data only: imported files hold no such state.
  bool teacher = false;
};

absl::Status Prepare(const PrepareOptions& options);

}  // namespace flashdraft
