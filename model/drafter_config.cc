#include "model/drafter_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace flashdraft {
namespace {

using json = nlohmann::json;

absl::Status Error(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

// Looks `key` up in dflash_config first, then at the top level.
const json* FindDFlash(const json& root, const std::string& key) {
  auto d = root.find("dflash_config");
  if (d != root.end() && d->is_object()) {
    auto it = d->find(key);
    if (it != d->end()) return &*it;
  }
  auto it = root.find(key);
  return it == root.end() ? nullptr : &*it;
}

absl::Status GetInt(const json& root, const std::string& key, const std::string& source,
                    int64_t& out, bool required, int64_t min_value) {
  auto it = root.find(key);
  if (it == root.end() || it->is_null()) {
    if (required) return Error(source, absl::StrCat("missing field '", key, "'"));
    return absl::OkStatus();
  }
  if (!it->is_number_integer()) {
    return Error(source, absl::StrCat("field '", key, "' must be an integer, got ", it->dump()));
  }
  out = it->get<int64_t>();
  if (out < min_value) {
    return Error(source, absl::StrCat("field '", key, "' = ", out, " must be >= ", min_value));
  }
  return absl::OkStatus();
}

// An optional positive number; `out` keeps its default when the field is absent.
absl::Status GetPositive(const json& root, const std::string& key, const std::string& source,
                         double& out) {
  auto it = root.find(key);
  if (it == root.end()) return absl::OkStatus();
  if (!it->is_number() || it->get<double>() <= 0) {
    return Error(source,
                 absl::StrCat("field '", key, "' must be a positive number, got ", it->dump()));
  }
  out = it->get<double>();
  return absl::OkStatus();
}

// An explicit causality override (vLLM reads `is_causal`, then dflash_config's `causal`): it
// applies to every layer, and this trainer's layers are non-causal when full, causal when sliding.
absl::Status CheckCausality(const json& root, const std::string& source, bool any_full,
                            bool any_sliding) {
  const auto d = root.find("dflash_config");
  const bool in_d = d != root.end() && d->is_object();
  const json* found[] = {root.contains("is_causal") ? &root["is_causal"] : nullptr,
                         in_d && d->contains("is_causal") ? &(*d)["is_causal"] : nullptr,
                         in_d && d->contains("causal") ? &(*d)["causal"] : nullptr};
  const char* names[] = {"is_causal", "dflash_config.is_causal", "dflash_config.causal"};
  for (int i = 0; i < 3; ++i) {
    if (found[i] == nullptr || found[i]->is_null()) continue;
    if (!found[i]->is_boolean()) {
      return Error(source, absl::StrCat("field '", names[i], "' must be true or false"));
    }
    if (found[i]->get<bool>() && any_full) {
      return Error(source,
                   absl::StrCat("field '", names[i],
                                "' = true (causal full-attention layers) is not supported"));
    }
    if (!found[i]->get<bool>() && any_sliding) {
      return Error(source, absl::StrCat("field '", names[i],
                                        "' = false with sliding_attention layers (non-causal "
                                        "sliding layers) is not supported: this trainer's sliding "
                                        "layers are causal inside their block"));
    }
  }
  return absl::OkStatus();
}

// ModelOpt / vLLM's own sliding-window keys (non-causal windows, attention sinks), at the top level
// or in dflash_config: another attention than this trainer's.
absl::Status RefuseOtherWindows(const json& root, const std::string& source) {
  const auto d = root.find("dflash_config");
  for (const json* scope : {&root, d != root.end() && d->is_object() ? &*d : nullptr}) {
    if (scope == nullptr) continue;
    const std::string where = scope == &root ? "" : "dflash_config.";
    for (const char* key : {"use_swa", "attention_sink_bias", "add_swa_attention_sink_bias"}) {
      auto it = scope->find(key);
      if (it == scope->end() || it->is_null() || (it->is_boolean() && !it->get<bool>())) continue;
      return Error(source, absl::StrCat("field '", where, key, "' = ", it->dump(),
                                        " (a non-causal sliding window or attention sink) is not "
                                        "supported; use layer_types and sliding_window"));
    }
  }
  return absl::OkStatus();
}

// layer_types (full_attention / sliding_attention, one per layer) and sliding_window, read as
// Hugging Face's Qwen3Config reads them: a window only with use_sliding_window: true.
absl::Status ParseLayerTypes(const json& root, const std::string& source, DrafterModelConfig& c) {
  FD_RETURN_IF_ERROR(RefuseOtherWindows(root, source));
  const bool use_window = root.contains("use_sliding_window") &&
                          root["use_sliding_window"].is_boolean() &&
                          root["use_sliding_window"].get<bool>();
  auto it = root.find("layer_types");
  if (it == root.end() || it->is_null()) {
    if (use_window) {
      return Error(source,
                   "use_sliding_window is true but there is no 'layer_types' (HF would pick the "
                   "sliding layers from max_window_layers): list each layer's type");
    }
    return CheckCausality(root, source, /*any_full=*/true, /*any_sliding=*/false);
  }
  if (!it->is_array() || static_cast<int64_t>(it->size()) != c.num_hidden_layers) {
    return Error(source, absl::StrCat("field 'layer_types' must list one type for each of the ",
                                      c.num_hidden_layers, " layers, got ", it->dump()));
  }
  for (const json& t : *it) {
    if (!t.is_string() ||
        (t.get<std::string>() != "full_attention" && t.get<std::string>() != "sliding_attention")) {
      return Error(source, absl::StrCat("layer_types entry ", t.dump(),
                                        " is not supported (full_attention or sliding_attention)"));
    }
    c.layer_types.push_back(t.get<std::string>());
  }
  const int64_t sliding =
      std::count(c.layer_types.begin(), c.layer_types.end(), "sliding_attention");
  const bool any_full = sliding<c.num_hidden_layers, any_sliding = sliding> 0;
  FD_RETURN_IF_ERROR(CheckCausality(root, source, any_full, any_sliding));
  if (!any_sliding) {
    c.layer_types.clear();  // all full: the same drafter as no list
    return absl::OkStatus();
  }
  if (!use_window) {
    return Error(source,
                 "layer_types has sliding_attention layers but use_sliding_window is not true "
                 "(HF would drop their window): set it true or the layers to full_attention");
  }
  FD_RETURN_IF_ERROR(GetInt(root, "sliding_window", source, c.sliding_window, true, c.block_size));
  const json* swa = FindDFlash(root, "swa_window_size");  // vLLM takes it over sliding_window
  if (swa != nullptr && !swa->is_null() && *swa != json(c.sliding_window)) {
    return Error(source, absl::StrCat("field 'swa_window_size' = ", swa->dump(),
                                      " differs from sliding_window = ", c.sliding_window));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int> DefaultTargetLayerIds(int num_target_layers, int n) {
  if (n <= 1) return {1};
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) {
    ids.push_back(static_cast<int>(
        std::lround(1.0 + static_cast<double>(i) * (num_target_layers - 4) / (n - 1))));
  }
  return ids;
}

absl::StatusOr<DrafterModelConfig> ParseDrafterConfig(const std::string& json_text,
                                                      const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    return Error(source, absl::StrCat("not valid JSON: ", e.what()));
  }
  if (!root.is_object()) return Error(source, "not a JSON object");

  // Features of newer drafters that change the numerics: refuse rather than train something else.
  for (const char* key : {"conv_kernel_size", "selector_type", "selector_hidden_size",
                          "output_multiplier", "final_logit_softcapping"}) {
    if (root.contains(key) && !root[key].is_null()) {
      return Error(source, absl::StrCat("field '", key, "' is not supported by this trainer"));
    }
  }
  if (root.contains("input_embedding_scale") && root["input_embedding_scale"].is_number() &&
      root["input_embedding_scale"].get<double>() != 1.0) {
    return Error(source,
                 absl::StrCat("input_embedding_scale = ", root["input_embedding_scale"].dump(),
                              " is not supported (only 1)"));
  }
  DrafterModelConfig c;
  FD_RETURN_IF_ERROR(GetInt(root, "hidden_size", source, c.hidden_size, true, 1));
  FD_RETURN_IF_ERROR(GetInt(root, "intermediate_size", source, c.intermediate_size, true, 1));
  FD_RETURN_IF_ERROR(GetInt(root, "num_hidden_layers", source, c.num_hidden_layers, true, 1));
  FD_RETURN_IF_ERROR(GetInt(root, "num_attention_heads", source, c.num_attention_heads, true, 1));
  c.num_key_value_heads = c.num_attention_heads;
  FD_RETURN_IF_ERROR(GetInt(root, "num_key_value_heads", source, c.num_key_value_heads, false, 1));
  c.head_dim = c.hidden_size / c.num_attention_heads;
  FD_RETURN_IF_ERROR(GetInt(root, "head_dim", source, c.head_dim, false, 2));
  FD_RETURN_IF_ERROR(GetInt(root, "vocab_size", source, c.vocab_size, true, 1));
  FD_RETURN_IF_ERROR(GetInt(root, "num_target_layers", source, c.num_target_layers, false, 1));
  FD_RETURN_IF_ERROR(
      GetInt(root, "max_position_embeddings", source, c.max_position_embeddings, false, 1));
  FD_RETURN_IF_ERROR(GetPositive(root, "rms_norm_eps", source, c.rms_norm_eps));
  FD_RETURN_IF_ERROR(GetPositive(root, "rope_theta", source, c.rope_theta));
  if (root.contains("rope_scaling") && !root["rope_scaling"].is_null()) {
    return Error(source, "field 'rope_scaling' is not supported for the drafter");
  }
  if (root.contains("tie_word_embeddings")) {
    if (!root["tie_word_embeddings"].is_boolean()) {
      return Error(source, "field 'tie_word_embeddings' must be true or false");
    }
    c.tie_word_embeddings = root["tie_word_embeddings"].get<bool>();
  }

  auto dflash_int = [&](const char* key, int64_t& out, int64_t min_value) -> absl::Status {
    const json* v = FindDFlash(root, key);
    if (v == nullptr)
      return Error(source,
                   absl::StrCat("missing field '", key, "' (in dflash_config or top level)"));
    if (!v->is_number_integer() || v->get<int64_t>() < min_value) {
      return Error(source, absl::StrCat("field '", key, "' must be an integer >= ", min_value,
                                        ", got ", v->dump()));
    }
    out = v->get<int64_t>();
    return absl::OkStatus();
  };
  FD_RETURN_IF_ERROR(dflash_int("block_size", c.block_size, 2));
  FD_RETURN_IF_ERROR(dflash_int("mask_token_id", c.mask_token_id, 0));
  const json* ids = FindDFlash(root, "target_layer_ids");
  if (ids == nullptr || !ids->is_array() || ids->empty()) {
    return Error(source, "missing or empty 'target_layer_ids' (in dflash_config or top level)");
  }
  for (const json& id : *ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      return Error(source, absl::StrCat("target_layer_ids entry ", id.dump(),
                                        " is not a non-negative integer"));
    }
    c.target_layer_ids.push_back(id.get<int>());
  }

  FD_RETURN_IF_ERROR(ParseLayerTypes(root, source, c));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Error(source, absl::StrCat("num_attention_heads = ", c.num_attention_heads,
                                      " is not a multiple of num_key_value_heads = ",
                                      c.num_key_value_heads));
  }
  if (c.head_dim % 2 != 0) {
    return Error(source, absl::StrCat("head_dim = ", c.head_dim, " must be even for RoPE"));
  }
  if (c.mask_token_id >= c.vocab_size) {
    return Error(source, absl::StrCat("mask_token_id = ", c.mask_token_id,
                                      " is outside the vocabulary of ", c.vocab_size));
  }
  return c;
}

absl::StatusOr<DrafterModelConfig> LoadDrafterConfig(const std::string& path) {
  FD_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseDrafterConfig(text, path);
}

std::string DrafterConfigToJson(const DrafterModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {"DFlashDraftModel"};
  j["model_type"] = "qwen3";
  j["torch_dtype"] = "bfloat16";  // the export's weights
  j["block_size"] = c.block_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_target_layers"] = c.num_target_layers;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  if (!c.layer_types.empty()) {
    j["layer_types"] = c.layer_types;
    j["use_sliding_window"] = true;
    j["sliding_window"] = c.sliding_window;
  }
  j["mask_token_id"] = c.mask_token_id;
  j["target_layer_ids"] = c.target_layer_ids;
  j["dflash_config"] = {{"mask_token_id", c.mask_token_id},
                        {"target_layer_ids", c.target_layer_ids},
                        {"block_size", c.block_size}};
  return j.dump(2) + "\n";
}

}  // namespace flashdraft
