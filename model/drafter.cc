#include "model/drafter.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/dflash_math.h"
#include "model/layers.h"
#include "model/precision.h"
#include "model/weighted_cross_entropy.h"
#include "model/wire_tensor.h"

namespace flashdraft {
namespace {

torch::nn::Linear MakeLinear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

// A sliding layer's mask while drafting a block at positions L..L+B-1 over a context of L: the
// query at L + t sees keys at positions in (L + t - window, L + t]. [B, L + B] bool.
torch::Tensor SlidingDecodeMask(int64_t context_length, int64_t block, int64_t window,
                                const torch::Device& device) {
  const auto opts = torch::TensorOptions().dtype(torch::kInt64).device(device);
  const torch::Tensor query = torch::arange(block, opts).view({-1, 1}) + context_length;
  const torch::Tensor key = torch::arange(context_length + block, opts).view({1, -1});
  return key.le(query).logical_and(key.gt(query - window));
}

// In a packed row (DrafterBatch::positions): the row position where the sample of each of
// `index` [b, m] starts, index − positions[index].
torch::Tensor SampleStart(const torch::Tensor& positions, const torch::Tensor& index) {
  return index - positions.gather(1, index);
}

// Σ w·loss over the predicted rows and their hits; fills the result's CE and KL sums.
std::pair<torch::Tensor, torch::Tensor> LossOfRows(
    const torch::Tensor& h, const torch::Tensor& head, const torch::Tensor& labels,
    const torch::Tensor& weights, const torch::Tensor& teacher, double ce_weight,
    torch::ScalarType compute, DrafterLossResult& result) {
  if (teacher.defined()) {
    const WeightedDistillation d =
        ChunkedWeightedDistillation(h, head, labels, teacher, weights, ce_weight, compute);
    result.weighted_ce_sum = d.weighted_ce.item<double>();
    result.weighted_kl_sum = d.weighted_kl.item<double>();
    return {d.weighted_sum, d.hits};
  }
  const WeightedCrossEntropy ce = ChunkedWeightedCrossEntropy(h, head, labels, weights, compute);
  result.weighted_ce_sum = ce.weighted_sum.item<double>();
  return {ce.weighted_sum, ce.hits};
}

// The target's hidden states that give its distribution of each weighted row's label x[a + k]:
// those at a + k − 1 (`targets`: a + k per row of [b, N·(B−1)], clamped; `rows`: the weighted
// ones), fp32 on `device`.
torch::Tensor TeacherRows(const DrafterBatch& batch, const torch::Tensor& targets,
                          const torch::Tensor& rows, int64_t hidden, const torch::Device& device) {
  const int64_t b = batch.input_ids.size(0), s = batch.input_ids.size(1);
  const torch::Tensor& all = batch.teacher_hidden;
  TORCH_CHECK(all.defined(), "distillation needs the target's hidden states");
  TORCH_CHECK(all.sizes() == torch::IntArrayRef({b, s, hidden}), "teacher_hidden is ", all.sizes(),
              ", expected [", b, ", ", s, ", ", hidden, "]");
  const torch::Tensor source =
      (torch::arange(b, targets.options()).view({b, 1}) * s + targets - 1).reshape(-1);
  return all.reshape({b * s, hidden})
      .index_select(0, source.index_select(0, rows).to(all.device()))
      .to(device, torch::kFloat32);
}

// Per slot 1..B−1: how many weighted rows there are and how many the drafter's argmax hit.
void CountSlots(const torch::Tensor& rows, const torch::Tensor& hit, int64_t block,
                DrafterLossResult& result) {
  torch::NoGradGuard no_grad;
  const torch::Tensor slot = rows.remainder(block - 1);
  const torch::Tensor correct =
      torch::zeros({block - 1}, rows.options()).index_add_(0, slot, hit).to(torch::kCPU);
  const torch::Tensor total = torch::zeros({block - 1}, rows.options())
                                  .index_add_(0, slot, torch::ones_like(slot))
                                  .to(torch::kCPU);
  result.slot_correct.assign(correct.data_ptr<int64_t>(), correct.data_ptr<int64_t>() + block - 1);
  result.slot_total.assign(total.data_ptr<int64_t>(), total.data_ptr<int64_t>() + block - 1);
  result.tokens = rows.numel();
}

// The dtypes a batch file's float tensors may have.
bool IsFloatDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

// The batch file's teacher_hidden [b, S, H] (float) for distillation, as fp32.
absl::StatusOr<torch::Tensor> LoadTeacherHidden(const SafetensorsFile& file, int64_t b, int64_t s,
                                                int64_t hidden) {
  FD_ASSIGN_OR_RETURN(TensorView teacher, file.Get("teacher_hidden"));
  const std::vector<int64_t> shape = {b, s, hidden};
  if (!IsFloatDType(teacher.dtype) || teacher.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": tensor 'teacher_hidden': ", DTypeName(teacher.dtype), " ",
        ShapeString(teacher.shape), ", expected F32, BF16 or F16 ", ShapeString(shape)));
  }
  return ToTorch(teacher).to(torch::kFloat32);
}

}  // namespace

RmsNormImpl::RmsNormImpl(int64_t size, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({size}));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) { return ApplyRmsNorm(x, weight, eps); }

DrafterAttentionImpl::DrafterAttentionImpl(const DrafterModelConfig& c) {
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
  q_proj = register_module("q_proj", MakeLinear(c.hidden_size, q_dim));
  k_proj = register_module("k_proj", MakeLinear(c.hidden_size, kv_dim));
  v_proj = register_module("v_proj", MakeLinear(c.hidden_size, kv_dim));
  o_proj = register_module("o_proj", MakeLinear(q_dim, c.hidden_size));
  q_norm = register_module("q_norm", RmsNorm(c.head_dim, c.rms_norm_eps));
  k_norm = register_module("k_norm", RmsNorm(c.head_dim, c.rms_norm_eps));
}

DrafterMlpImpl::DrafterMlpImpl(const DrafterModelConfig& c) {
  gate_proj = register_module("gate_proj", MakeLinear(c.hidden_size, c.intermediate_size));
  up_proj = register_module("up_proj", MakeLinear(c.hidden_size, c.intermediate_size));
  down_proj = register_module("down_proj", MakeLinear(c.intermediate_size, c.hidden_size));
}

torch::Tensor DrafterMlpImpl::forward(const torch::Tensor& x, torch::ScalarType compute) {
  return LinearIn(
      compute,
      torch::silu(LinearIn(compute, x, gate_proj->weight)) * LinearIn(compute, x, up_proj->weight),
      down_proj->weight);
}

DrafterLayerImpl::DrafterLayerImpl(const DrafterModelConfig& c) {
  input_layernorm = register_module("input_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps));
  self_attn = register_module("self_attn", DrafterAttention(c));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps));
  mlp = register_module("mlp", DrafterMlp(c));
}

DrafterImpl::DrafterImpl(DrafterModelConfig config) : config_(std::move(config)) {
  TORCH_CHECK(config_.layer_types.empty() ||
                  static_cast<int64_t>(config_.layer_types.size()) == config_.num_hidden_layers,
              "the drafter's layer_types must name each of its layers");
  attention_options.block_size = config_.block_size;
  fc = register_module("fc", MakeLinear(config_.feature_size(), config_.hidden_size));
  hidden_norm = register_module("hidden_norm", RmsNorm(config_.hidden_size, config_.rms_norm_eps));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) layers->push_back(DrafterLayer(config_));
  norm = register_module("norm", RmsNorm(config_.hidden_size, config_.rms_norm_eps));
}

void DrafterImpl::SetFrozen(torch::Tensor embed_tokens, torch::Tensor lm_head) {
  embed_tokens_ = embed_tokens.detach().to(device_, torch::kFloat32);
  lm_head_ = lm_head.detach().to(device_, torch::kFloat32);
  lm_head_compute_ = torch::Tensor();
}

void DrafterImpl::SetComputeDtype(torch::ScalarType compute) {
  TORCH_CHECK(compute == torch::kFloat32 || compute == torch::kBFloat16,
              "the drafter computes in fp32 or bf16");
  compute_ = compute;
  attention_options.compute = compute;
  lm_head_compute_ = torch::Tensor();
}

void DrafterImpl::MoveTo(const torch::Device& device) {
  to(device);
  device_ = device;
  if (embed_tokens_.defined()) embed_tokens_ = embed_tokens_.to(device);
  if (lm_head_.defined()) lm_head_ = lm_head_.to(device);
  lm_head_compute_ = torch::Tensor();
}

const torch::Tensor& DrafterImpl::ComputeHead() {
  if (compute_ == torch::kFloat32) return lm_head_;
  // One bf16 copy of the frozen head for every step (at a 152k vocabulary it is 1.2 GB to read).
  if (!lm_head_compute_.defined()) lm_head_compute_ = lm_head_.to(compute_);
  return lm_head_compute_;
}

void DrafterImpl::InitWeights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(seed);
  for (auto& item : named_parameters()) {
    torch::Tensor& p = item.value();
    if (p.dim() == 1) {
      p.fill_(1.0);
    } else {
      p.normal_(0.0, 0.02, generator);
    }
  }
}

torch::Tensor DrafterImpl::Forward(const torch::Tensor& features, const torch::Tensor& block_ids,
                                   const torch::Tensor& anchors, const torch::Tensor& keep,
                                   const torch::Tensor& positions) {
  const DrafterModelConfig& c = config_;
  const int64_t b = features.size(0), s = features.size(1), n = anchors.size(1);
  const int64_t block = c.block_size, nb = n * block, heads = c.num_attention_heads,
                kv_heads = c.num_key_value_heads, hd = c.head_dim;
  // Context: fc + hidden_norm once, shared by all layers; it never passes input_layernorm.
  const torch::Tensor ctx = hidden_norm(LinearIn(
      compute_, compute_ == torch::kFloat32 ? features.to(torch::kFloat32) : features, fc->weight));
  torch::Tensor x =
      embed_tokens_.index_select(0, block_ids.reshape(-1)).view({b, nb, c.hidden_size});

  const auto opts = anchors.options();
  // Packed rows: positions count from each sample's start, and a block's context starts there.
  const bool packed = positions.defined();
  const torch::Tensor pos = packed ? positions.to(opts) : torch::Tensor();
  const torch::Tensor context_begin = packed ? SampleStart(pos, anchors) : torch::Tensor();
  const torch::Tensor anchor_pos = packed ? anchors - context_begin : anchors;
  const torch::Tensor pos_q =  // slot t of a → a + t (in its sample)
      (anchor_pos.unsqueeze(-1) + torch::arange(block, opts)).view({b, nb});
  auto [cos_q, sin_q] = RopeTables(pos_q, hd, c.rope_theta);  // [b, NB, hd]
  auto [cos_c, sin_c] = RopeTables(packed ? pos : torch::arange(s, opts), hd,
                                   c.rope_theta);  // [b, S, hd] or [S, hd]
  cos_q = cos_q.unsqueeze(1);
  sin_q = sin_q.unsqueeze(1);
  if (packed) {
    cos_c = cos_c.unsqueeze(1);
    sin_c = sin_c.unsqueeze(1);
  }

  for (size_t l = 0; l < layers->size(); ++l) {
    auto layer = layers[l]->as<DrafterLayerImpl>();
    auto& attn = *layer->self_attn;
    const torch::Tensor xn = layer->input_layernorm(x);
    auto heads_of = [&](const torch::Tensor& t, int64_t h) {
      return t.view({b, -1, h, hd}).transpose(1, 2);  // [b, h, T, hd]
    };
    torch::Tensor q = ApplyRope(
        heads_of(attn.q_norm(LinearIn(compute_, xn, attn.q_proj->weight).view({b, nb, heads, hd})),
                 heads)
            .contiguous(),
        cos_q, sin_q);
    torch::Tensor kc = ApplyRope(
        heads_of(
            attn.k_norm(LinearIn(compute_, ctx, attn.k_proj->weight).view({b, s, kv_heads, hd})),
            kv_heads),
        cos_c, sin_c);
    torch::Tensor kb = ApplyRope(
        heads_of(
            attn.k_norm(LinearIn(compute_, xn, attn.k_proj->weight).view({b, nb, kv_heads, hd})),
            kv_heads),
        cos_q, sin_q);
    torch::Tensor vc = heads_of(LinearIn(compute_, ctx, attn.v_proj->weight), kv_heads);
    torch::Tensor vb = heads_of(LinearIn(compute_, xn, attn.v_proj->weight), kv_heads);
    if (heads != kv_heads) {
      const int64_t groups = heads / kv_heads;
      kc = kc.repeat_interleave(groups, 1);
      vc = vc.repeat_interleave(groups, 1);
      kb = kb.repeat_interleave(groups, 1);
      vb = vb.repeat_interleave(groups, 1);
    }
    BlockAttentionOptions layer_options = attention_options;
    layer_options.sliding_window = c.WindowOfLayer(static_cast<int64_t>(l));
    const torch::Tensor o =
        DFlashBlockAttention(q, kc, vc, kb, vb, anchors, keep, layer_options, context_begin);
    x = x + LinearIn(compute_, o.transpose(1, 2).reshape({b, nb, heads * hd}), attn.o_proj->weight);
    x = x + layer->mlp->forward(layer->post_attention_layernorm(x), compute_);
  }
  return norm(x).view({b, n, block, c.hidden_size});
}

void DrafterImpl::ExtendContext(DrafterContext& context, const torch::Tensor& features) {
  torch::NoGradGuard no_grad;
  const DrafterModelConfig& c = config_;
  const int64_t m = features.size(1), kv_heads = c.num_key_value_heads, hd = c.head_dim;
  if (m == 0) return;
  const torch::Tensor ctx = hidden_norm(fc(features.to(torch::kFloat32)));
  auto [cos, sin] = RopeTables(torch::arange(context.length, context.length + m, torch::kInt64), hd,
                               c.rope_theta);
  context.keys.resize(layers->size());
  context.values.resize(layers->size());
  for (size_t l = 0; l < layers->size(); ++l) {
    auto& attn = *layers[l]->as<DrafterLayerImpl>()->self_attn;
    const torch::Tensor k = ApplyRope(
        attn.k_norm(attn.k_proj(ctx).view({1, m, kv_heads, hd})).transpose(1, 2), cos, sin);
    const torch::Tensor v = attn.v_proj(ctx).view({1, m, kv_heads, hd}).transpose(1, 2);
    context.keys[l] = context.keys[l].defined() ? torch::cat({context.keys[l], k}, 2) : k;
    context.values[l] = context.values[l].defined() ? torch::cat({context.values[l], v}, 2) : v;
  }
  context.length += m;
}

std::vector<int64_t> DrafterImpl::Draft(const DrafterContext& context, int64_t first_token,
                                        int64_t block) {
  torch::NoGradGuard no_grad;
  const DrafterModelConfig& c = config_;
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads, hd = c.head_dim;
  std::vector<int64_t> ids(static_cast<size_t>(block), c.mask_token_id);
  ids[0] = first_token;
  torch::Tensor x =
      embed_tokens_.index_select(0, torch::tensor(ids, torch::kInt64)).unsqueeze(0);  // [1, B, H]
  auto [cos, sin] = RopeTables(torch::arange(context.length, context.length + block, torch::kInt64),
                               hd, c.rope_theta);
  for (size_t l = 0; l < layers->size(); ++l) {
    auto layer = layers[l]->as<DrafterLayerImpl>();
    auto& attn = *layer->self_attn;
    const torch::Tensor xn = layer->input_layernorm(x);
    const torch::Tensor q = ApplyRope(
        attn.q_norm(attn.q_proj(xn).view({1, block, heads, hd})).transpose(1, 2), cos, sin);
    torch::Tensor k = ApplyRope(
        attn.k_norm(attn.k_proj(xn).view({1, block, kv_heads, hd})).transpose(1, 2), cos, sin);
    torch::Tensor v = attn.v_proj(xn).view({1, block, kv_heads, hd}).transpose(1, 2);
    if (context.length > 0) {
      k = torch::cat({context.keys[l], k}, 2);
      v = torch::cat({context.values[l], v}, 2);
    }
    if (heads != kv_heads) {
      k = k.repeat_interleave(heads / kv_heads, 1);
      v = v.repeat_interleave(heads / kv_heads, 1);
    }
    torch::Tensor scores = torch::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(hd));
    if (const int64_t window = c.WindowOfLayer(static_cast<int64_t>(l)); window > 0) {
      scores = scores.masked_fill(
          SlidingDecodeMask(context.length, block, window, scores.device()).logical_not(),
          -INFINITY);
    }
    const torch::Tensor p = torch::softmax(scores, -1);
    const torch::Tensor o = torch::matmul(p, v);  // [1, heads, B, hd]
    x = x + attn.o_proj(o.transpose(1, 2).reshape({1, block, heads * hd}));
    x = x + layer->mlp(layer->post_attention_layernorm(x));
  }
  const torch::Tensor logits = torch::matmul(norm(x).squeeze(0).narrow(0, 1, block - 1),
                                             lm_head_.t());  // [B-1, V]
  const torch::Tensor best = logits.argmax(-1).contiguous();
  return std::vector<int64_t>(best.data_ptr<int64_t>(), best.data_ptr<int64_t>() + block - 1);
}

DrafterLossResult DrafterImpl::Loss(const DrafterBatch& batch, double gamma,
                                    std::optional<double> normaliser, double ce_weight) {
  const DrafterModelConfig& c = config_;
  const int64_t b = batch.input_ids.size(0), s = batch.input_ids.size(1);
  const int64_t n = batch.anchors.size(1), block = c.block_size;
  const auto opts = batch.anchors.options();
  const torch::Tensor keep = batch.anchors.ge(0);
  const torch::Tensor anchors = batch.anchors.clamp_min(0);

  // Blocks: [x[a], MASK × (B-1)].
  const torch::Tensor first = batch.input_ids.gather(1, anchors).unsqueeze(-1);
  const torch::Tensor block_ids =
      torch::cat({first, torch::full({b, n, block - 1}, c.mask_token_id, opts)}, -1);
  const torch::Tensor hidden =
      Forward(batch.hidden_states, block_ids, anchors, keep, batch.positions);

  // Slot k = 1..B-1 predicts x[a + k]; weight keep · [a+k < S] · loss_mask[a+k] · exp(-(k-1)/γ).
  const torch::Tensor k = torch::arange(1, block, opts);
  const torch::Tensor target = anchors.unsqueeze(-1) + k;  // [b, N, B-1]
  torch::Tensor valid = target.lt(s).logical_and(keep.unsqueeze(-1));
  const torch::Tensor target_c = target.clamp_max(s - 1).view({b, -1});
  if (batch.positions.defined()) {  // a packed row: x[a + k] must be of the anchor's sample
    const torch::Tensor pos = batch.positions.to(opts);
    valid = valid.logical_and(SampleStart(pos, target_c).view({b, n, block - 1}) ==
                              SampleStart(pos, anchors).unsqueeze(-1));
  }
  const torch::Tensor labels = batch.input_ids.gather(1, target_c).view({b, n, block - 1});
  const torch::Tensor lm =
      batch.loss_mask.to(torch::kFloat32).gather(1, target_c).view({b, n, block - 1});
  const torch::Tensor m = valid.to(torch::kFloat32) * lm;
  const torch::Tensor decay = torch::exp(-(k.to(torch::kFloat32) - 1) / gamma);
  const torch::Tensor w = m * decay;

  // Only rows that carry weight reach lm_head: padding and empty slots cost nothing.
  const torch::Tensor rows = m.reshape(-1).gt(0).nonzero().squeeze(-1);
  const torch::Tensor h =
      hidden.narrow(2, 1, block - 1).reshape({-1, c.hidden_size}).index_select(0, rows);
  const torch::Tensor row_labels = labels.reshape(-1).index_select(0, rows);
  const torch::Tensor row_w = w.reshape(-1).index_select(0, rows);
  DrafterLossResult result;
  TORCH_CHECK(ce_weight >= 0 && ce_weight <= 1, "ce_weight must be in [0, 1]");
  const torch::Tensor teacher = ce_weight < 1.0
                                    ? TeacherRows(batch, target_c, rows, c.hidden_size, h.device())
                                    : torch::Tensor();
  auto [objective, hit] =
      LossOfRows(h, ComputeHead(), row_labels, row_w, teacher, ce_weight, compute_, result);
  result.weight_sum = w.to(torch::kFloat64).sum().item<double>();  // exact across splits
  const double denom = normaliser.value_or(result.weight_sum);
  result.loss = denom > 0 ? objective / denom : objective * 0.0;
  CountSlots(rows, hit, block, result);
  return result;
}

std::vector<double> DrafterLossResult::SlotAccuracy() const {
  return flashdraft::SlotAccuracy(slot_correct, slot_total);
}

double DrafterLossResult::TauEstimate() const { return flashdraft::TauEstimate(SlotAccuracy()); }

absl::Status LoadDrafterWeights(DrafterImpl& drafter, const SafetensorsModel& weights,
                                bool with_frozen) {
  torch::NoGradGuard no_grad;
  auto load = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return LoadFloatWeight(weights, name, shape);
  };
  for (auto& item : drafter.named_parameters()) {
    FD_ASSIGN_OR_RETURN(torch::Tensor t, load(item.key(), item.value().sizes().vec()));
    item.value().copy_(t);
  }
  if (!with_frozen) return absl::OkStatus();
  const DrafterModelConfig& c = drafter.config();
  const std::vector<int64_t> table = {c.vocab_size, c.hidden_size};
  FD_ASSIGN_OR_RETURN(torch::Tensor embed, load("embed_tokens.weight", table));
  torch::Tensor head;
  if (weights.Contains("lm_head.weight") || !c.tie_word_embeddings) {
    FD_ASSIGN_OR_RETURN(head, load("lm_head.weight", table));
  } else {
    head = embed;
  }
  drafter.SetFrozen(embed, head);
  return absl::OkStatus();
}

absl::StatusOr<DrafterBatch> LoadDrafterBatch(const SafetensorsFile& file,
                                              const DrafterModelConfig& config) {
  const std::string& path = file.path();
  auto error = [&](const std::string& name, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "': ", what));
  };
  FD_ASSIGN_OR_RETURN(TensorView ids, file.GetChecked("input_ids", DType::kI64));
  if (ids.shape.size() != 2 || ids.shape[1] < 2) {
    return error("input_ids",
                 absl::StrCat("shape ", ShapeString(ids.shape), " is not [b, S] with S >= 2"));
  }
  const int64_t b = ids.shape[0], s = ids.shape[1];
  FD_ASSIGN_OR_RETURN(TensorView mask, file.Get("loss_mask"));
  if (mask.dtype != DType::kI64 && mask.dtype != DType::kU8 && mask.dtype != DType::kBool &&
      mask.dtype != DType::kI32) {
    return error("loss_mask",
                 absl::StrCat("dtype ", DTypeName(mask.dtype), ", expected I64, I32, U8 or BOOL"));
  }
  if (mask.shape != ids.shape) {
    return error("loss_mask", absl::StrCat("shape ", ShapeString(mask.shape), ", expected ",
                                           ShapeString(ids.shape)));
  }
  FD_ASSIGN_OR_RETURN(TensorView feats, file.Get("hidden_states"));
  if (!IsFloatDType(feats.dtype)) {
    return error("hidden_states",
                 absl::StrCat("dtype ", DTypeName(feats.dtype), ", expected F32, BF16 or F16"));
  }
  const std::vector<int64_t> feat_shape = {b, s, config.feature_size()};
  if (feats.shape != feat_shape) {
    return error(
        "hidden_states",
        absl::StrCat("shape ", ShapeString(feats.shape), ", expected ", ShapeString(feat_shape),
                     " (n·H = ", config.target_layer_ids.size(), "·", config.hidden_size, ")"));
  }
  FD_ASSIGN_OR_RETURN(TensorView anchors, file.GetChecked("anchors", DType::kI64));
  if (anchors.shape.size() != 2 || anchors.shape[0] != b || anchors.shape[1] < 1) {
    return error("anchors",
                 absl::StrCat("shape ", ShapeString(anchors.shape), ", expected [", b, ", N]"));
  }
  DrafterBatch batch;
  batch.input_ids = ToTorch(ids);
  batch.loss_mask = ToTorch(mask).to(torch::kInt64);
  batch.hidden_states = ToTorch(feats).to(torch::kFloat32);
  batch.anchors = ToTorch(anchors);
  if (file.Contains("teacher_hidden")) {
    FD_ASSIGN_OR_RETURN(batch.teacher_hidden, LoadTeacherHidden(file, b, s, config.hidden_size));
  }
  const int64_t max_id = batch.input_ids.max().item<int64_t>();
  const int64_t min_id = batch.input_ids.min().item<int64_t>();
  if (min_id < 0 || max_id >= config.vocab_size) {
    return error("input_ids", absl::StrCat("ids must be in [0, ", config.vocab_size, "), found ",
                                           min_id < 0 ? min_id : max_id));
  }
  const int64_t* a = batch.anchors.data_ptr<int64_t>();
  const int64_t n = anchors.shape[1];
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t v = a[i * n + j];
      if (v < -1 || v > s - 2) {
        return error("anchors",
                     absl::StrCat("anchors[", i, "][", j, "] = ", v, " is outside [0, S-2] = [0, ",
                                  s - 2, "] (or -1 for empty)"));
      }
    }
  }
  return batch;
}

}  // namespace flashdraft
