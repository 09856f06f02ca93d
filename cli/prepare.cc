#include "cli/prepare.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "coordinator/sources/shard_source.h"
#include "model/drafter_config.h"
#include "model/target_model.h"

namespace flashdraft {
namespace {

// One JSONL line → ids and mask, or an error naming what is wrong (the caller adds file:line).
absl::Status ParseLine(const std::string& line, int64_t vocab, std::vector<int64_t>& ids,
                       std::vector<int64_t>& mask) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", e.what()));
  }
  if (!j.is_object() || !j.contains("input_ids") || !j["input_ids"].is_array() ||
      !j.contains("loss_mask") || !j["loss_mask"].is_array()) {
    return absl::InvalidArgumentError("needs \"input_ids\" and \"loss_mask\" lists");
  }
  ids.clear();
  mask.clear();
  for (const auto& v : j["input_ids"]) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("input_ids entry ", v.dump(), " is not a token id in [0, ", vocab, ")"));
    }
    ids.push_back(v.get<int64_t>());
  }
  for (const auto& v : j["loss_mask"]) {
    if (!v.is_number_integer() || (v.get<int64_t>() != 0 && v.get<int64_t>() != 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("loss_mask entry ", v.dump(), " is not 0 or 1"));
    }
    mask.push_back(v.get<int64_t>());
  }
  if (ids.empty() || ids.size() != mask.size()) {
    return absl::InvalidArgumentError(absl::StrCat("input_ids (", ids.size(), ") and loss_mask (",
                                                   mask.size(),
                                                   ") must have the same, non-zero length"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Prepare(const PrepareOptions& o) {
  FD_ASSIGN_OR_RETURN(auto model, TargetModel::Load(o.target));
  const TargetModelConfig& t = model->config();
  std::vector<int> layers = o.layer_ids;
  if (layers.empty())
    layers = DefaultTargetLayerIds(static_cast<int>(t.num_hidden_layers), o.num_features);
  for (int id : layers) {
    if (id < 0 || id >= t.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("layer id ", id, " is outside the target's ",
                                                     t.num_hidden_layers, " layers"));
    }
  }
  std::ifstream in(o.data);
  if (!in) return absl::NotFoundError(absl::StrCat(o.data, ": cannot open"));
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", o.out, ": ", ec.message()));

  const int64_t feature_size = static_cast<int64_t>(layers.size()) * t.hidden_size;
  const DType dtype = o.float32_features ? DType::kF32 : DType::kBF16;
  ShardWriter writer(o.out, feature_size, dtype, o.samples_per_shard);
  FD_ASSIGN_OR_RETURN(int64_t done, writer.ResumeExisting());
  if (done > 0)
    std::printf("resuming: %lld samples already in complete shards\n",
                static_cast<long long>(done));

  std::string line;
  int64_t line_no = 0, valid = 0, written = 0, bad = 0, tokens = 0;
  std::vector<int64_t> ids, mask;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    absl::Status s = ParseLine(line, t.vocab_size, ids, mask);
    if (!s.ok()) {
      const std::string where = absl::StrCat(o.data, ":", line_no, ": ", s.message());
      if (!o.skip_bad_lines) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " (--skip-bad-lines to skip such lines)"));
      }
      std::fprintf(stderr, "skipped %s\n", where.c_str());
      ++bad;
      continue;
    }
    if (valid++ < done) continue;  // in a complete shard of an earlier run
    if (static_cast<int64_t>(ids.size()) > o.max_seq_len) {
      ids.resize(o.max_seq_len);
      mask.resize(o.max_seq_len);
    }
    const torch::Tensor input = torch::tensor(ids, torch::kInt64).unsqueeze(0);
    FD_ASSIGN_OR_RETURN(TargetOutput out, model->Forward(input, layers, /*with_logits=*/false));
    const torch::Tensor features =
        out.features.squeeze(0)
            .to(dtype == DType::kBF16 ? torch::kBFloat16 : torch::kFloat32)
            .contiguous();
    FD_RETURN_IF_ERROR(writer.Add(ids, mask, features.data_ptr()));
    ++written;
    tokens += static_cast<int64_t>(ids.size());
    if (written % 64 == 0) {
      std::printf("\rprepared %lld samples (%lld tokens)", static_cast<long long>(done + written),
                  static_cast<long long>(tokens));
      std::fflush(stdout);
    }
  }
  if (valid == 0) return absl::InvalidArgumentError(absl::StrCat(o.data, ": no valid samples"));

  DrafterModelConfig d;
  d.hidden_size = t.hidden_size;
  d.intermediate_size = t.intermediate_size;
  d.num_hidden_layers = 1;  // the job decides
  d.num_attention_heads = t.num_attention_heads;
  d.num_key_value_heads = t.num_key_value_heads;
  d.head_dim = t.head_dim;
  d.vocab_size = t.vocab_size;
  d.num_target_layers = t.num_hidden_layers;
  d.max_position_embeddings = std::max<int64_t>(o.max_seq_len, 4096);
  d.rms_norm_eps = t.rms_norm_eps;
  d.rope_theta = t.rope_theta;
  d.tie_word_embeddings = t.tie_word_embeddings;
  d.mask_token_id = o.mask_token_id >= 0 ? o.mask_token_id : t.vocab_size - 1;
  d.target_layer_ids = layers;
  writer.SetMetadata("drafter_config", DrafterConfigToJson(d));
  writer.SetMetadata("source",
                     absl::StrCat("flashdraft prepare --target ", o.target, " --data ", o.data));

  const torch::Tensor embed = model->embed_tokens().to(torch::kFloat32).contiguous();
  const torch::Tensor head = model->lm_head().to(torch::kFloat32).contiguous();
  SafetensorsWriter target;
  FD_RETURN_IF_ERROR(target.Add("embed_tokens.weight", DType::kF32, embed.sizes().vec(),
                                embed.data_ptr(), embed.nbytes()));
  if (!t.tie_word_embeddings) {
    FD_RETURN_IF_ERROR(target.Add("lm_head.weight", DType::kF32, head.sizes().vec(),
                                  head.data_ptr(), head.nbytes()));
  }
  FD_RETURN_IF_ERROR(target.Write(o.out + "/target.safetensors"));
  FD_RETURN_IF_ERROR(writer.Finish());
  std::printf("\rprepared %lld samples (%lld new, %lld tokens), %lld bad line(s) skipped -> %s\n",
              static_cast<long long>(valid), static_cast<long long>(written),
              static_cast<long long>(tokens), static_cast<long long>(bad), o.out.c_str());
  return absl::OkStatus();
}

}  // namespace flashdraft
