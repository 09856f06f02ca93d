#include "model/synthetic_data.h"

#include <cmath>

#include "model/anchors.h"

namespace flashdraft {

SyntheticLanguage MakeSyntheticLanguage(int64_t vocab_size, int64_t feature_size, double noise,
                                        uint64_t seed) {
  auto generator = at::detail::createCPUGenerator(seed);
  SyntheticLanguage lang;
  lang.vocab_size = vocab_size;
  lang.feature_size = feature_size;
  lang.noise = noise;
  lang.successor = torch::randperm(vocab_size - 1, generator, torch::kInt64);
  lang.feature_table = torch::randn({vocab_size, feature_size}, generator, torch::kFloat32);
  return lang;
}

DrafterBatch MakeSyntheticBatch(const SyntheticLanguage& lang, const SyntheticBatchOptions& o,
                                uint64_t seed, uint64_t step) {
  auto generator = at::detail::createCPUGenerator(MixSeed(seed, step, 0x5eed));
  const int64_t b = o.batch, s = o.seq_len, tokens = lang.vocab_size - 1;
  torch::Tensor ids = torch::zeros({b, s}, torch::kInt64);
  torch::Tensor loss_mask = torch::zeros({b, s}, torch::kInt64);
  const torch::Tensor random_ids = torch::randint(0, tokens, {b, s}, generator, torch::kInt64);
  const torch::Tensor coin = torch::rand({b, s}, generator, torch::kFloat32);
  const torch::Tensor length_draw = torch::randint(s * 3 / 4, s + 1, {b}, generator, torch::kInt64);
  auto id = ids.accessor<int64_t, 2>();
  auto lm = loss_mask.accessor<int64_t, 2>();
  auto rnd = random_ids.accessor<int64_t, 2>();
  auto c = coin.accessor<float, 2>();
  const int64_t* succ = lang.successor.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> masks(b);
  std::vector<uint64_t> sample_ids(b);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t len = o.variable_length ? length_draw[i].item<int64_t>() : s;
    id[i][0] = rnd[i][0];
    for (int64_t t = 1; t < len; ++t) {
      id[i][t] = c[i][t] < lang.noise ? rnd[i][t] : succ[id[i][t - 1]];
    }
    for (int64_t t = std::min(o.prompt_len, len); t < len; ++t) lm[i][t] = 1;
    masks[i].assign(lm[i].data(), lm[i].data() + s);
    sample_ids[i] = step * static_cast<uint64_t>(b) + static_cast<uint64_t>(i);
  }
  const AnchorMatrix anchors = SampleBatchAnchors(masks, o.max_anchors, seed, step, sample_ids);
  DrafterBatch batch;
  batch.input_ids = ids;
  batch.loss_mask = loss_mask;
  batch.hidden_states = lang.feature_table.index_select(0, ids.view(-1)).view({b, s, -1});
  batch.anchors = torch::tensor(anchors.values, torch::kInt64).view({anchors.rows, anchors.cols});
  return batch;
}

std::pair<torch::Tensor, torch::Tensor> MakeSyntheticTarget(const SyntheticLanguage& lang,
                                                            int64_t hidden_size, uint64_t seed) {
  auto generator = at::detail::createCPUGenerator(seed);
  const double scale = 3.0 / std::sqrt(static_cast<double>(hidden_size));
  torch::Tensor embed =
      torch::randn({lang.vocab_size, hidden_size}, generator, torch::kFloat32) * scale;
  torch::Tensor head =
      torch::randn({lang.vocab_size, hidden_size}, generator, torch::kFloat32) * scale;
  return {embed, head};
}

DrafterModelConfig SyntheticDrafterConfig(const SyntheticLanguage& lang, int64_t block_size,
                                          int64_t hidden_size, int64_t layers) {
  DrafterModelConfig c;
  c.hidden_size = hidden_size;
  c.intermediate_size = 3 * hidden_size;
  c.num_hidden_layers = layers;
  c.num_attention_heads = std::max<int64_t>(1, hidden_size / 32);
  c.num_key_value_heads = std::max<int64_t>(1, c.num_attention_heads / 2);
  c.head_dim = 32;
  c.vocab_size = lang.vocab_size;
  c.block_size = block_size;
  c.num_target_layers = 8;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.mask_token_id = lang.vocab_size - 1;
  const int64_t n = lang.feature_size / hidden_size;
  c.target_layer_ids = DefaultTargetLayerIds(8, static_cast<int>(n));
  return c;
}

}  // namespace flashdraft
