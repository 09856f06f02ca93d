#include "model/drafter_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

// z-lab/Qwen3-8B-DFlash-b16 style: DFlash fields inside dflash_config.
constexpr const char* kQwen3_8B = R"({
  "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
  "num_hidden_layers": 5, "num_target_layers": 36, "hidden_size": 4096,
  "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8,
  "head_dim": 128, "rms_norm_eps": 1e-06, "rope_theta": 1000000, "vocab_size": 151936,
  "max_position_embeddings": 40960, "tie_word_embeddings": false,
  "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}})";

TEST(DrafterConfigTest, ParsesTheHeadlineConfig) {
  auto c = ParseDrafterConfig(kQwen3_8B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->block_size, 16);
  EXPECT_EQ(c->mask_token_id, 151669);
  EXPECT_EQ(c->feature_size(), 5 * 4096);
  EXPECT_EQ(c->target_layer_ids, (std::vector<int>{1, 9, 17, 25, 33}));
  // Round trip through the export writer.
  auto again = ParseDrafterConfig(DrafterConfigToJson(*c), "export");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->num_key_value_heads, 8);
  EXPECT_EQ(again->target_layer_ids, c->target_layer_ids);
  // Loaders pick the weights' dtype from it (the export is BF16).
  EXPECT_NE(DrafterConfigToJson(*c).find("\"torch_dtype\": \"bfloat16\""), std::string::npos);
}

constexpr const char* kSliding =
    R"("layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                       "sliding_attention", "full_attention"], "use_sliding_window": true)";

// Sliding-window layers read back as written and go out with the keys SGLang / vLLM read; a list
// of only full layers (or a non-causal override on them) is the plain drafter.
TEST(DrafterConfigTest, SlidingWindowLayersRoundTrip) {
  const std::string base = kQwen3_8B;
  const std::string text = base.substr(0, base.size() - 1) + ", " + kSliding +
                           R"(, "sliding_window": 2048, "max_window_layers": 5})";
  auto c = ParseDrafterConfig(text, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 2048);
  EXPECT_EQ(c->WindowOfLayer(0), 2048);
  EXPECT_EQ(c->WindowOfLayer(2), 0);
  EXPECT_EQ(c->WindowOfLayer(3), 2048);
  const std::string json = DrafterConfigToJson(*c);
  EXPECT_THAT(json, HasSubstr(R"("sliding_window": 2048)"));
  EXPECT_THAT(json, HasSubstr(R"("use_sliding_window": true)"));
  EXPECT_THAT(json, HasSubstr(R"("layer_types": [)"));
  EXPECT_THAT(json, ::testing::Not(HasSubstr("causal")));  // servers derive it from layer_types
  auto again = ParseDrafterConfig(json, "export");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->layer_types, c->layer_types);
  EXPECT_EQ(again->sliding_window, 2048);

  // is_causal: true says what every layer already is when all of them slide.
  auto all_sliding = ParseDrafterConfig(
      base.substr(0, base.size() - 1) +
          R"(, "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
              "sliding_attention", "sliding_attention"], "use_sliding_window": true,
              "sliding_window": 64, "is_causal": true})",
      "config.json");
  ASSERT_TRUE(all_sliding.ok()) << all_sliding.status();
  EXPECT_EQ(all_sliding->WindowOfLayer(4), 64);

  auto full = ParseDrafterConfig(
      base.substr(0, base.size() - 1) +
          R"(, "layer_types": ["full_attention", "full_attention", "full_attention",
              "full_attention", "full_attention"], "sliding_window": 4096,
              "use_sliding_window": false, "is_causal": false})",
      "config.json");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_TRUE(full->layer_types.empty());
  EXPECT_EQ(full->sliding_window, 0);
  EXPECT_EQ(DrafterConfigToJson(*full), DrafterConfigToJson(*ParseDrafterConfig(kQwen3_8B, "x")));
}

TEST(DrafterConfigTest, DefaultTargetLayerIds) {
  EXPECT_EQ(DefaultTargetLayerIds(36, 5), (std::vector<int>{1, 9, 17, 25, 33}));
  EXPECT_EQ(DefaultTargetLayerIds(28, 5), (std::vector<int>{1, 7, 13, 19, 25}));
}

TEST(DrafterConfigTest, RefusesWhatItCannotTrain) {
  struct Case {
    std::string patch;
    const char* error;
  };
  const std::string base = kQwen3_8B;
  auto with = [&](const std::string& field) {
    return base.substr(0, base.size() - 1) + ", " + field + "}";
  };
  const Case cases[] = {
      {with(R"("conv_kernel_size": 4)"), "field 'conv_kernel_size' is not supported"},
      {with(R"("final_logit_softcapping": 30.0)"),
       "field 'final_logit_softcapping' is not supported"},
      {with(R"("input_embedding_scale": 2.0)"), "input_embedding_scale = 2.0 is not supported"},
      {with(R"("layer_types": ["sliding_attention"])"),
       "field 'layer_types' must list one type for each of the 5 layers"},
      {with(R"("layer_types": ["full_attention", "full_attention", "full_attention",
               "full_attention", "chunked_attention"], "sliding_window": 64)"),
       "layer_types entry \"chunked_attention\" is not supported"},
      {with(kSliding), "missing field 'sliding_window'"},
      {with(std::string(kSliding) + R"(, "sliding_window": 8)"),
       "field 'sliding_window' = 8 must be >= 16"},
      {with(R"("layer_types": ["sliding_attention", "full_attention", "full_attention",
               "full_attention", "full_attention"], "sliding_window": 64)"),
       "use_sliding_window is not true (HF would drop their window)"},
      {with(R"("use_sliding_window": true, "sliding_window": 64)"),
       "use_sliding_window is true but there is no 'layer_types'"},
      {with(std::string(kSliding) + R"(, "sliding_window": 64, "swa_window_size": 128)"),
       "field 'swa_window_size' = 128 differs from sliding_window = 64"},
      {with(R"("attention_sink_bias": true)"), "field 'attention_sink_bias' = true"},
      {with(std::string(kSliding) + R"(, "sliding_window": 64, "is_causal": false)"),
       "field 'is_causal' = false with sliding_attention layers"},
      {with(R"("is_causal": true)"), "field 'is_causal' = true (causal full-attention layers)"},
      {with(R"("is_causal": "no")"), "field 'is_causal' must be true or false"},
      {with(R"("use_swa": true, "swa_window_size": 2048)"), "field 'use_swa' = true"},
      {R"({"hidden_size": 8})", "missing field 'intermediate_size'"},
      {"[1]", "not a JSON object"},
      {"{", "not valid JSON"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseDrafterConfig(c.patch, "config.json");
    ASSERT_FALSE(parsed.ok()) << c.patch;
    EXPECT_THAT(parsed.status().message(), HasSubstr("config.json: "));
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.error));
  }
}

}  // namespace
}  // namespace flashdraft
