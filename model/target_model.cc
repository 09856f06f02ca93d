#include "model/target_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "common/status_macros.h"
#include "model/causal_attention.h"
#include "model/layers.h"
#include "model/wire_tensor.h"

namespace flashdraft {
namespace {

// HF's Llama-3 frequency remapping ("rope_type": "llama3").
torch::Tensor Llama3InvFreq(torch::Tensor inv_freq, const TargetModelConfig& c) {
  const double old_len = static_cast<double>(c.rope_original_max_position);
  const double low_wavelen = old_len / c.rope_low_freq_factor;
  const double high_wavelen = old_len / c.rope_high_freq_factor;
  const torch::Tensor wavelen = 2 * M_PI / inv_freq;
  torch::Tensor scaled = torch::where(wavelen > low_wavelen, inv_freq / c.rope_factor, inv_freq);
  const torch::Tensor smooth = (old_len / wavelen - c.rope_low_freq_factor) /
                               (c.rope_high_freq_factor - c.rope_low_freq_factor);
  const torch::Tensor smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
  const torch::Tensor medium = wavelen.ge(high_wavelen).logical_and(wavelen.le(low_wavelen));
  return torch::where(medium, smoothed, scaled);
}

}  // namespace

absl::Status WriteFrozenTargetTensors(const TargetModel& model, const std::string& path) {
  SafetensorsWriter out;
  const torch::Tensor embed = model.embed_tokens().to(torch::kFloat32).contiguous();
  FD_RETURN_IF_ERROR(out.Add("embed_tokens.weight", DType::kF32, embed.sizes().vec(),
                             embed.data_ptr(), embed.nbytes()));
  torch::Tensor head;
  if (!model.config().tie_word_embeddings) {
    head = model.lm_head().to(torch::kFloat32).contiguous();
    FD_RETURN_IF_ERROR(
        out.Add("lm_head.weight", DType::kF32, head.sizes().vec(), head.data_ptr(), head.nbytes()));
  }
  return out.Write(path);
}

absl::StatusOr<std::unique_ptr<TargetModel>> TargetModel::Load(const std::string& dir,
                                                               torch::ScalarType dtype,
                                                               bool without_layers) {
  FD_ASSIGN_OR_RETURN(std::string text, ReadFile(dir + "/config.json"));
  FD_ASSIGN_OR_RETURN(TargetModelConfig c, ParseTargetConfig(text, dir + "/config.json"));
  FD_ASSIGN_OR_RETURN(auto weights, SafetensorsModel::Open(dir));
  // A large target on slow storage loads for minutes: a log line every 10 s says how far it is
  // (and a coordinator under `launch` is not taken for one that hangs: its silence is timed).
  const bool own_head = weights->Contains("lm_head.weight") || !c.tie_word_embeddings;
  const int64_t tensors =
      2 + (own_head ? 1 : 0) + (without_layers ? 0 : c.num_hidden_layers * (c.qk_norm ? 11 : 9));
  Progress progress = Progress::ForLog(absl::StrCat("loading the target ", dir),
                                       static_cast<double>(tensors), "tensors");
  int64_t loaded = 0;
  absl::StatusOr<std::unique_ptr<TargetModel>> model = FromWeights(
      c,
      [&](const std::string& name, const std::vector<int64_t>& shape) {
        absl::StatusOr<torch::Tensor> t = LoadFloatWeight(*weights, name, shape, dtype);
        progress.Update(static_cast<double>(++loaded));
        return t;
      },
      [&](const std::string& name) { return weights->Contains(name); }, /*trainable=*/false,
      without_layers);
  progress.Finish();
  return model;
}

absl::StatusOr<std::unique_ptr<TargetModel>> TargetModel::FromWeights(
    const TargetModelConfig& c, const WeightGetter& load,
    const std::function<bool(const std::string&)>& has, bool trainable, bool without_layers) {
  auto model = std::unique_ptr<TargetModel>(new TargetModel());
  model->config_ = c;
  model->trainable_ = trainable;
  model->options_.dense_attention = trainable;  // autograd through the dense form
  const int64_t h = c.hidden_size, q_dim = c.num_attention_heads * c.head_dim,
                kv_dim = c.num_key_value_heads * c.head_dim, inter = c.intermediate_size;
  FD_ASSIGN_OR_RETURN(model->embed_, load("model.embed_tokens.weight", {c.vocab_size, h}));
  FD_ASSIGN_OR_RETURN(model->final_norm_, load("model.norm.weight", {h}));
  if (has("lm_head.weight") || !c.tie_word_embeddings) {
    FD_ASSIGN_OR_RETURN(model->lm_head_, load("lm_head.weight", {c.vocab_size, h}));
  } else {
    model->lm_head_ = model->embed_;
  }
  for (int64_t i = 0; i < (without_layers ? 0 : c.num_hidden_layers); ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer l;
    FD_ASSIGN_OR_RETURN(l.input_norm, load(p + "input_layernorm.weight", {h}));
    FD_ASSIGN_OR_RETURN(l.post_norm, load(p + "post_attention_layernorm.weight", {h}));
    FD_ASSIGN_OR_RETURN(l.q, load(p + "self_attn.q_proj.weight", {q_dim, h}));
    FD_ASSIGN_OR_RETURN(l.k, load(p + "self_attn.k_proj.weight", {kv_dim, h}));
    FD_ASSIGN_OR_RETURN(l.v, load(p + "self_attn.v_proj.weight", {kv_dim, h}));
    FD_ASSIGN_OR_RETURN(l.o, load(p + "self_attn.o_proj.weight", {h, q_dim}));
    if (c.qk_norm) {
      FD_ASSIGN_OR_RETURN(l.q_norm, load(p + "self_attn.q_norm.weight", {c.head_dim}));
      FD_ASSIGN_OR_RETURN(l.k_norm, load(p + "self_attn.k_norm.weight", {c.head_dim}));
    }
    FD_ASSIGN_OR_RETURN(l.gate, load(p + "mlp.gate_proj.weight", {inter, h}));
    FD_ASSIGN_OR_RETURN(l.up, load(p + "mlp.up_proj.weight", {inter, h}));
    FD_ASSIGN_OR_RETURN(l.down, load(p + "mlp.down_proj.weight", {h, inter}));
    model->layers_.push_back(std::move(l));
  }
  torch::Tensor inv_freq = RopeInverseFrequencies(c.head_dim, c.rope_theta);
  if (c.rope_factor > 0) inv_freq = Llama3InvFreq(inv_freq, c);
  model->inv_freq_ = inv_freq;
  return model;
}

namespace {

// Calls f on every weight of a decoder layer (Layer or const Layer); q_norm and k_norm are
// undefined without qk_norm.
template <typename L, typename F>
void ForEachWeight(L& l, F f) {
  for (auto* t : {&l.input_norm, &l.post_norm, &l.q, &l.k, &l.v, &l.o, &l.q_norm, &l.k_norm,
                  &l.gate, &l.up, &l.down}) {
    if (t->defined()) f(*t);
  }
}

}  // namespace

void TargetModel::MoveTo(const torch::Device& device) {
  const bool tied = lm_head_.is_same(embed_);
  embed_ = embed_.to(device);
  lm_head_ = tied ? embed_ : lm_head_.to(device);
  final_norm_ = final_norm_.to(device);
  for (Layer& l : layers_) ForEachWeight(l, [&](torch::Tensor& t) { t = t.to(device); });
}

int64_t TargetModel::WeightBytes() const {
  int64_t bytes = embed_.nbytes() + final_norm_.nbytes();
  if (!lm_head_.is_same(embed_)) bytes += lm_head_.nbytes();
  for (const Layer& l : layers_) {
    ForEachWeight(l, [&](const torch::Tensor& t) { bytes += t.nbytes(); });
  }
  return bytes;
}

torch::Tensor TargetModel::Mlp(const Layer& l, const torch::Tensor& h) const {
  auto mlp = [&](const torch::Tensor& rows) {
    return torch::matmul(
        torch::silu(torch::matmul(rows, l.gate.t())) * torch::matmul(rows, l.up.t()), l.down.t());
  };
  const int64_t s = h.size(1);
  const int64_t row_bytes =
      config_.intermediate_size * static_cast<int64_t>(c10::elementSize(h.scalar_type())) * 3;
  const int64_t rows =
      std::max<int64_t>(1, options_.mlp_chunk_bytes / std::max<int64_t>(1, row_bytes));
  if (trainable_ || s <= rows) return mlp(h);
  torch::Tensor out = torch::empty_like(h);
  for (int64_t t0 = 0; t0 < s; t0 += rows) {
    const int64_t n = std::min(rows, s - t0);
    out.narrow(1, t0, n).copy_(mlp(h.narrow(1, t0, n)));
  }
  return out;
}

torch::Tensor TargetModel::DecoderLayer(int64_t i, const torch::Tensor& x_in,
                                        const torch::Tensor& cos, const torch::Tensor& sin,
                                        KvCache* cache) const {
  const TargetModelConfig& c = config_;
  const Layer& l = layers_[i];
  const int64_t b = x_in.size(0), s = x_in.size(1), hd = c.head_dim;
  const torch::Tensor xn = ApplyRmsNorm(x_in, l.input_norm, c.rms_norm_eps);
  torch::Tensor q = torch::matmul(xn, l.q.t()).view({b, s, c.num_attention_heads, hd});
  torch::Tensor k = torch::matmul(xn, l.k.t()).view({b, s, c.num_key_value_heads, hd});
  torch::Tensor v =
      torch::matmul(xn, l.v.t()).view({b, s, c.num_key_value_heads, hd}).transpose(1, 2);
  if (c.qk_norm) {
    q = ApplyRmsNorm(q, l.q_norm, c.rms_norm_eps);
    k = ApplyRmsNorm(k, l.k_norm, c.rms_norm_eps);
  }
  q = ApplyRope(q.transpose(1, 2), cos, sin);
  k = ApplyRope(k.transpose(1, 2), cos, sin);
  if (cache != nullptr) {
    if (cache->keys[i].defined()) {
      k = torch::cat({cache->keys[i], k}, 2);
      v = torch::cat({cache->values[i], v}, 2);
    }
    cache->keys[i] = k;
    cache->values[i] = v;
  }
  const torch::Tensor attn = options_.dense_attention
                                 ? CausalAttentionDense(q, k, v)
                                 : CausalAttention(q, k, v, options_.attention);
  torch::Tensor x = x_in + torch::matmul(attn.transpose(1, 2).reshape({b, s, -1}), l.o.t());
  return x + Mlp(l, ApplyRmsNorm(x, l.post_norm, c.rms_norm_eps));
}

absl::Status TargetModel::CheckInput(const torch::Tensor& input_ids,
                                     const std::vector<int>& layer_ids) const {
  const TargetModelConfig& c = config_;
  if (static_cast<int64_t>(layers_.size()) != c.num_hidden_layers) {
    return absl::FailedPreconditionError(
        "the target was loaded without its decoder layers (feeders run it): no forward here");
  }
  for (int id : layer_ids) {
    if (id < 0 || id >= c.num_hidden_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer id ", id, " is outside [0, ", c.num_hidden_layers, ")"));
    }
  }
  if (input_ids.dim() != 2) return absl::InvalidArgumentError("input_ids must be [b, S]");
  if (input_ids.numel() > 0 &&
      (input_ids.min().item<int64_t>() < 0 || input_ids.max().item<int64_t>() >= c.vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat("input_ids must be in [0, ", c.vocab_size, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TargetOutput> TargetModel::Forward(const torch::Tensor& input_ids_in,
                                                  const std::vector<int>& layer_ids,
                                                  bool with_logits, KvCache* cache) const {
  const torch::Tensor input_ids = input_ids_in.to(embed_.device());  // the model's device
  FD_RETURN_IF_ERROR(CheckInput(input_ids, layer_ids));
  const TargetModelConfig& c = config_;
  torch::AutoGradMode grad_mode(trainable_);  // inference builds no graph
  const int64_t b = input_ids.size(0), s = input_ids.size(1);
  const int64_t past = cache != nullptr ? cache->length() : 0;
  if (cache != nullptr && cache->keys.empty()) {
    cache->keys.resize(c.num_hidden_layers);
    cache->values.resize(c.num_hidden_layers);
  }
  const auto dtype = embed_.scalar_type();
  torch::Tensor x = embed_.index_select(0, input_ids.reshape(-1)).view({b, s, c.hidden_size});
  const auto positions = torch::TensorOptions().dtype(torch::kInt64).device(embed_.device());
  auto [cos, sin] = RopeTablesFromInvFreq(torch::arange(past, past + s, positions), inv_freq_);
  cos = cos.to(dtype);
  sin = sin.to(dtype);
  // Only the requested layers' outputs are kept (a real target has dozens of [S, H] layers), and
  // without logits or a cache to fill, the layers past the deepest requested one are not run.
  std::vector<torch::Tensor> outputs(c.num_hidden_layers);
  const int64_t run_layers = with_logits || cache != nullptr || layer_ids.empty()
                                 ? c.num_hidden_layers
                                 : *std::max_element(layer_ids.begin(), layer_ids.end()) + 1;
  for (int64_t i = 0; i < run_layers; ++i) {
    x = DecoderLayer(i, x, cos, sin, cache);
    if (std::find(layer_ids.begin(), layer_ids.end(), i) != layer_ids.end()) outputs[i] = x;
  }
  // Layer id i means Hugging Face's output_hidden_states[i + 1], which serving feeds the drafter:
  // the output of decoder layer i, except for the last layer, whose entry is after the model's
  // final norm (DFLASH.md §2).
  const bool last_requested =
      std::find(layer_ids.begin(), layer_ids.end(), c.num_hidden_layers - 1) != layer_ids.end();
  torch::Tensor normed;
  if (with_logits || last_requested) normed = ApplyRmsNorm(x, final_norm_, c.rms_norm_eps);
  if (last_requested) outputs.back() = normed;
  TargetOutput out;
  std::vector<torch::Tensor> selected;
  for (int id : layer_ids) selected.push_back(outputs[id]);
  if (!selected.empty()) out.features = torch::cat(selected, -1);
  if (with_logits) out.logits = torch::matmul(normed, lm_head_.t());
  return out;
}

}  // namespace flashdraft
