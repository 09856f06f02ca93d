// Target decoders (Qwen3, Llama incl. Llama-3 RoPE scaling) loaded from Hugging Face folders
// (config.json + model.safetensors or a sharded index). They give the outputs of the requested
// decoder layers (layer id i = output of decoder layer i = HF hidden_states[i+1], DFLASH.md §2),
// the final logits when asked, and decode incrementally with a KV cache.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/safetensors.h"
#include "model/causal_attention.h"
#include "model/drafter_config.h"
#include "model/target_config.h"

namespace flashdraft {

class TargetModel;
// Writes the target's frozen tensors the drafter needs — embed_tokens.weight and, unless tied,
// lm_head.weight, both F32 — as the safetensors file workers fetch (target.safetensors).
absl::Status WriteFrozenTargetTensors(const TargetModel& model, const std::string& path);

// Per-layer key/value cache for incremental decoding: [b, kv_heads, T, head_dim] per layer.
struct KvCache {
  std::vector<torch::Tensor> keys, values;
  int64_t length() const { return keys.empty() || !keys[0].defined() ? 0 : keys[0].size(2); }
};

// How Forward bounds its memory; the defaults keep a layer's temporaries near 32 MiB at any S.
struct TargetForwardOptions {
  // Attention with the whole [S, S] score matrix instead of tiles (memory quadratic in S): for
  // comparisons (`flashdraft debug target-features --dense-attention`) and training.
  bool dense_attention = false;
  CausalAttentionOptions attention;
  // The feed-forward runs over chunks of positions whose [rows, intermediate] activations (three
  // of them) stay within this.
  int64_t mlp_chunk_bytes = int64_t{32} << 20;
};

struct TargetOutput {
  // [b, S, n·H]: the requested layers' hidden states concatenated in the given order; id i is
  // Hugging Face's output_hidden_states[i + 1] (the last layer's is after the final norm).
  torch::Tensor features;
  torch::Tensor logits;  // [b, S, V] when asked
};

class TargetModel {
 public:
  // Loads `dir` (config.json + weights); errors name the file and the tensor. `without_layers`
  // loads the embedding, final norm and lm_head only (a coordinator whose feeders run the target):
  // Forward then refuses.
  static absl::StatusOr<std::unique_ptr<TargetModel>> Load(
      const std::string& dir, torch::ScalarType dtype = torch::kFloat32,
      bool without_layers = false);

  // Runs input_ids [b, S] (continuing `cache` when given, positions offset by its length).
  // Layer ids must be in [0, num_hidden_layers).
  absl::StatusOr<TargetOutput> Forward(const torch::Tensor& input_ids,
                                       const std::vector<int>& layer_ids, bool with_logits,
                                       KvCache* cache = nullptr) const;

  // Builds a model from tensors named as in Hugging Face checkpoints: `get(name, shape)` returns
  // each (or an error), `has(name)` tells whether an optional one (lm_head.weight) exists. With
  // `trainable`, Forward records autograd so the tensors can be trained (make-tiny-target);
  // otherwise it never does.
  using WeightGetter =
      std::function<absl::StatusOr<torch::Tensor>(const std::string&, const std::vector<int64_t>&)>;
  static absl::StatusOr<std::unique_ptr<TargetModel>> FromWeights(
      const TargetModelConfig& config, const WeightGetter& get,
      const std::function<bool(const std::string&)>& has, bool trainable = false,
      bool without_layers = false);

  // Moves the weights to `device` (target.device: cuda); Forward then runs there, whatever device
  // its input_ids are on, and returns tensors on it.
  void MoveTo(const torch::Device& device);
  void SetForwardOptions(const TargetForwardOptions& options) { options_ = options; }
  // The bytes of the weights (a tied lm_head counted once).
  int64_t WeightBytes() const;
  torch::Device device() const { return embed_.device(); }

  const TargetModelConfig& config() const { return config_; }
  const torch::Tensor& embed_tokens() const { return embed_; }
  const torch::Tensor& lm_head() const { return lm_head_; }

 private:
  struct Layer {
    torch::Tensor input_norm, post_norm, q, k, v, o, q_norm, k_norm, gate, up, down;
  };
  absl::Status CheckInput(const torch::Tensor& input_ids, const std::vector<int>& layer_ids) const;
  // Decoder layer i on x [b, s, H] at the positions of cos/sin, extending `cache` when given.
  torch::Tensor DecoderLayer(int64_t i, const torch::Tensor& x, const torch::Tensor& cos,
                             const torch::Tensor& sin, KvCache* cache) const;
  // The feed-forward, over chunks of positions in inference.
  torch::Tensor Mlp(const Layer& l, const torch::Tensor& h) const;
  TargetModelConfig config_;
  torch::Tensor embed_, lm_head_, final_norm_, inv_freq_;
  std::vector<Layer> layers_;
  bool trainable_ = false;
  TargetForwardOptions options_;
};

}  // namespace flashdraft
