#include "model/target_config.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace flashdraft {
namespace {

using json = nlohmann::json;

absl::Status ConfigError(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

}  // namespace

absl::StatusOr<TargetModelConfig> ParseTargetConfig(const std::string& text,
                                                    const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return ConfigError(source, absl::StrCat("not valid JSON: ", e.what()));
  }
  if (!j.is_object()) return ConfigError(source, "not a JSON object");
  TargetModelConfig c;
  c.model_type = j.value("model_type", "");
  if (c.model_type != "qwen3" && c.model_type != "llama") {
    return ConfigError(source, absl::StrCat("unsupported architecture: model_type '", c.model_type,
                                            "' (supported: qwen3, llama)"));
  }
  c.qk_norm = c.model_type == "qwen3";
  auto get_int = [&](const char* key, int64_t& out, bool required) -> absl::Status {
    if (!j.contains(key) || j[key].is_null()) {
      return required ? ConfigError(source, absl::StrCat("missing field '", key, "'"))
                      : absl::OkStatus();
    }
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1) {
      return ConfigError(source, absl::StrCat("field '", key, "' must be a positive integer, got ",
                                              j[key].dump()));
    }
    out = j[key].get<int64_t>();
    return absl::OkStatus();
  };
  FD_RETURN_IF_ERROR(get_int("hidden_size", c.hidden_size, true));
  FD_RETURN_IF_ERROR(get_int("intermediate_size", c.intermediate_size, true));
  FD_RETURN_IF_ERROR(get_int("num_hidden_layers", c.num_hidden_layers, true));
  FD_RETURN_IF_ERROR(get_int("num_attention_heads", c.num_attention_heads, true));
  FD_RETURN_IF_ERROR(get_int("vocab_size", c.vocab_size, true));
  c.num_key_value_heads = c.num_attention_heads;
  FD_RETURN_IF_ERROR(get_int("num_key_value_heads", c.num_key_value_heads, false));
  c.head_dim = c.hidden_size / c.num_attention_heads;
  FD_RETURN_IF_ERROR(get_int("head_dim", c.head_dim, false));
  if (j.contains("rms_norm_eps") && j["rms_norm_eps"].is_number())
    c.rms_norm_eps = j["rms_norm_eps"];
  if (j.contains("rope_theta") && j["rope_theta"].is_number()) c.rope_theta = j["rope_theta"];
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  if (j.value("attention_bias", false) || j.value("mlp_bias", false)) {
    return ConfigError(source, "attention_bias / mlp_bias are not supported");
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& rs = j["rope_scaling"];
    const std::string type = rs.value("rope_type", rs.value("type", ""));
    if (type != "llama3") {
      return ConfigError(
          source, absl::StrCat("rope_scaling type '", type, "' is not supported (only llama3)"));
    }
    c.rope_factor = rs.value("factor", 8.0);
    c.rope_low_freq_factor = rs.value("low_freq_factor", 1.0);
    c.rope_high_freq_factor = rs.value("high_freq_factor", 4.0);
    c.rope_original_max_position = rs.value("original_max_position_embeddings", int64_t{8192});
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return ConfigError(source, "num_attention_heads is not a multiple of num_key_value_heads");
  }
  return c;
}

DrafterModelConfig DrafterConfigForTarget(const TargetModelConfig& t,
                                          const std::vector<int>& layers, int64_t max_seq_len,
                                          int64_t mask_token_id) {
  DrafterModelConfig d;
  d.hidden_size = t.hidden_size;
  d.intermediate_size = t.intermediate_size;
  d.num_hidden_layers = 1;  // the job decides
  d.num_attention_heads = t.num_attention_heads;
  d.num_key_value_heads = t.num_key_value_heads;
  d.head_dim = t.head_dim;
  d.vocab_size = t.vocab_size;
  d.num_target_layers = t.num_hidden_layers;
  d.max_position_embeddings = std::max<int64_t>(max_seq_len, 4096);
  d.rms_norm_eps = t.rms_norm_eps;
  d.rope_theta = t.rope_theta;
  d.tie_word_embeddings = t.tie_word_embeddings;
  d.mask_token_id = mask_token_id >= 0 ? mask_token_id : t.vocab_size - 1;
  d.target_layer_ids = layers;
  return d;
}

int64_t TargetParameterCount(const TargetModelConfig& c) {
  const int64_t h = c.hidden_size, q_dim = c.num_attention_heads * c.head_dim,
                kv_dim = c.num_key_value_heads * c.head_dim;
  const int64_t per_layer = 2 * h + 2 * h * q_dim + 2 * h * kv_dim + 3 * h * c.intermediate_size +
                            (c.qk_norm ? 2 * c.head_dim : 0);
  return c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2) + h + c.num_hidden_layers * per_layer;
}

}  // namespace flashdraft
