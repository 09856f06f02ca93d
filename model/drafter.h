// The DFlash drafter (DFLASH.md §3) and its training loss (§4) in LibTorch. Parameter names are the
// HF export names (fc.weight, layers.0.self_attn.q_proj.weight, ...); the target's embedding and
// lm_head are frozen tensors held beside the module, never parameters.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "common/safetensors.h"
#include "model/dflash_attention.h"
#include "model/drafter_config.h"

namespace flashdraft {

class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t size, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RmsNorm);

class DrafterAttentionImpl : public torch::nn::Module {
 public:
  explicit DrafterAttentionImpl(const DrafterModelConfig& c);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RmsNorm q_norm{nullptr}, k_norm{nullptr};
};
TORCH_MODULE(DrafterAttention);

class DrafterMlpImpl : public torch::nn::Module {
 public:
  explicit DrafterMlpImpl(const DrafterModelConfig& c);
  // Products in `compute` (model/precision.h), the result in fp32.
  torch::Tensor forward(const torch::Tensor& x, torch::ScalarType compute = torch::kFloat32);
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(DrafterMlp);

class DrafterLayerImpl : public torch::nn::Module {
 public:
  explicit DrafterLayerImpl(const DrafterModelConfig& c);
  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  DrafterAttention self_attn{nullptr};
  DrafterMlp mlp{nullptr};
};
TORCH_MODULE(DrafterLayer);

// One training batch (right-padded).
struct DrafterBatch {
  torch::Tensor input_ids;      // [b, S] int64
  torch::Tensor loss_mask;      // [b, S] any integer or bool dtype, 1 on assistant tokens
  torch::Tensor hidden_states;  // [b, S, n·H] target features (float)
  torch::Tensor anchors;        // [b, N] int64, sorted, -1 = empty slot
  // [b, S, H] float, for distillation only (ce_weight < 1): the target's last hidden state after
  // its final norm, what its lm_head reads; position p gives the target's distribution of x[p+1].
  torch::Tensor teacher_hidden;
  // [b, S] int64, for rows that pack several samples: each token's position in its own sample (0
  // at a sample's first token). A block then sees only its own sample's tokens before its anchor,
  // RoPE counts from the sample's start, and a slot past the sample's end predicts nothing: the
  // loss of each sample is what it is alone in a row. Undefined: one sample per row.
  torch::Tensor positions;
};

struct DrafterLossResult {
  torch::Tensor loss;                 // Σ w·(α·CE + (1−α)·KL) / normaliser, differentiable
  double weighted_ce_sum = 0;         // Σ w·CE
  double weighted_kl_sum = 0;         // Σ w·KL(target ‖ drafter); 0 without distillation
  double weight_sum = 0;              // Σ w
  std::vector<int64_t> slot_correct;  // slots 1..B-1: [argmax == label]·keep·valid·loss_mask
  std::vector<int64_t> slot_total;    // slots 1..B-1: keep·valid·loss_mask
  int64_t tokens = 0;                 // predicted positions (Σ slot_total)

  // acc_k = correct_k / total_k (0 where total_k = 0).
  std::vector<double> SlotAccuracy() const;
  // τ_est = 1 + Σ_k Π_{i≤k} acc_i (DFLASH.md §4).
  double TauEstimate() const;
};

// Inference (DFLASH.md §5): the context's keys and values in every drafter layer, grown as the
// target accepts tokens (what a server's drafter KV cache holds).
struct DrafterContext {
  std::vector<torch::Tensor> keys, values;  // per layer: [1, kv_heads, T, head_dim], RoPE applied
  int64_t length = 0;                       // T: positions 0 .. T-1
};

class DrafterImpl : public torch::nn::Module {
 public:
  explicit DrafterImpl(DrafterModelConfig config);

  // Frozen target tensors: embedding [V, H] (the MASK row included) and lm_head [V, H].
  void SetFrozen(torch::Tensor embed_tokens, torch::Tensor lm_head);

  // The training forward's arithmetic (train.precision, model/precision.h): kFloat32 (default) or
  // kBFloat16 products. Inference (ExtendContext, Draft) is always fp32.
  void SetComputeDtype(torch::ScalarType compute);
  torch::ScalarType compute_dtype() const { return compute_; }

  // Moves the parameters and the frozen tensors to `device` (before an optimizer is built on the
  // parameters). Tensors set later with SetFrozen go there too.
  void MoveTo(const torch::Device& device);
  const torch::Device& device() const { return device_; }

  // Hidden states after the final norm for every block slot: [b, N, B, H].
  // anchors: [b, N] (≥ 0), keep: [b, N] bool, block_ids: [b, N, B]; positions: DrafterBatch's
  // (packed rows), or undefined.
  torch::Tensor Forward(const torch::Tensor& features, const torch::Tensor& block_ids,
                        const torch::Tensor& anchors, const torch::Tensor& keep,
                        const torch::Tensor& positions = torch::Tensor());

  // The DFlash loss of a batch. `gamma`: loss decay. `normaliser`: the Σw the loss is divided by
  // (the global Σw across workers); defaults to this batch's own Σw. `ce_weight` α: each predicted
  // position's loss is α·CE(next token) + (1−α)·KL(target's distribution ‖ drafter's), with the
  // same decayed weight; α < 1 needs batch.teacher_hidden.
  DrafterLossResult Loss(const DrafterBatch& batch, double gamma,
                         std::optional<double> normaliser = std::nullopt, double ce_weight = 1.0);

  // Appends the target features of the next positions, [1, m, n·H], to `context`.
  void ExtendContext(DrafterContext& context, const torch::Tensor& features);
  // Drafts one block: [first_token, MASK × (block-1)] at positions T .. T+block-1 attends to the
  // whole context and to itself (the training mask for an anchor at T); returns the argmax of
  // slots 1 .. block-1. `block` ≤ config().block_size.
  std::vector<int64_t> Draft(const DrafterContext& context, int64_t first_token, int64_t block);

  // normal(0, 0.02) for every projection, ones for every norm (DFLASH.md §3).
  void InitWeights(uint64_t seed);

  const DrafterModelConfig& config() const { return config_; }
  const torch::Tensor& embed_tokens() const { return embed_tokens_; }
  const torch::Tensor& lm_head() const { return lm_head_; }

  BlockAttentionOptions attention_options;

  torch::nn::Linear fc{nullptr};
  RmsNorm hidden_norm{nullptr}, norm{nullptr};
  torch::nn::ModuleList layers{nullptr};

 private:
  // lm_head in the compute dtype (bf16: made once, not every step).
  const torch::Tensor& ComputeHead();

  DrafterModelConfig config_;
  torch::Tensor embed_tokens_, lm_head_, lm_head_compute_;
  torch::ScalarType compute_ = torch::kFloat32;
  torch::Device device_{torch::kCPU};
};
TORCH_MODULE(Drafter);

// Loads every trainable parameter (F32, BF16 or F16, converted to fp32) by its HF name, and
// embed_tokens.weight / lm_head.weight (lm_head taken from embed_tokens when tied and absent).
// Errors name the file, the tensor and the expected shape.
absl::Status LoadDrafterWeights(DrafterImpl& drafter, const SafetensorsModel& weights,
                                bool with_frozen = true);

// Reads a batch file (input_ids, loss_mask, hidden_states, anchors) and checks it against `config`.
absl::StatusOr<DrafterBatch> LoadDrafterBatch(const SafetensorsFile& file,
                                              const DrafterModelConfig& config);

}  // namespace flashdraft
