#include "cli/make_shards.h"

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/shard_format.h"
#include "common/status_macros.h"
#include "model/synthetic_data.h"

namespace flashdraft {

absl::Status MakeShards(const MakeShardsOptions& o) {
  if (o.out.empty() || o.samples < 1 || o.seq_len < 16 || o.vocab_size < 4 || o.hidden_size < 32 ||
      o.hidden_size % 32 != 0 || o.num_features < 1) {
    return absl::InvalidArgumentError(
        "need --out, samples >= 1, seq >= 16, vocab >= 4, hidden a multiple of 32, features >= 1");
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", o.out, ": ", ec.message()));
  const SyntheticLanguage lang =
      MakeSyntheticLanguage(o.vocab_size, o.num_features * o.hidden_size, o.noise, o.seed);
  ShardWriter writer(o.out, lang.feature_size, DType::kBF16, o.samples_per_shard);
  SyntheticBatchOptions bo;
  bo.batch = 16;
  bo.seq_len = o.seq_len;
  bo.max_anchors = 1;
  for (int64_t first = 0, step = 0; first < o.samples; first += bo.batch, ++step) {
    const DrafterBatch batch = MakeSyntheticBatch(lang, bo, o.seed, static_cast<uint64_t>(step));
    for (int64_t i = 0; i < bo.batch && first + i < o.samples; ++i) {
      // Right padding ends where the loss mask does.
      const torch::Tensor mask = batch.loss_mask[i];
      const int64_t len = mask.nonzero().max().item<int64_t>() + 1;
      const torch::Tensor ids = batch.input_ids[i].narrow(0, 0, len).contiguous();
      const torch::Tensor lm = mask.narrow(0, 0, len).contiguous();
      const torch::Tensor feats =
          batch.hidden_states[i].narrow(0, 0, len).to(torch::kBFloat16).contiguous();
      FD_RETURN_IF_ERROR(
          writer.Add(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + len),
                     std::vector<int64_t>(lm.data_ptr<int64_t>(), lm.data_ptr<int64_t>() + len),
                     feats.data_ptr()));
    }
  }
  const DrafterModelConfig config = SyntheticDrafterConfig(lang, 16, o.hidden_size, 1);
  writer.SetMetadata("drafter_config", DrafterConfigToJson(config));
  writer.SetMetadata("source", absl::StrCat("flashdraft make-shards (synthetic, noise ", o.noise,
                                            ", seed ", o.seed, ")"));
  auto [embed, lm_head] = MakeSyntheticTarget(lang, o.hidden_size, o.seed + 1);
  SafetensorsWriter target;
  FD_RETURN_IF_ERROR(target.Add("embed_tokens.weight", DType::kF32, embed.sizes().vec(),
                                embed.data_ptr(), embed.nbytes()));
  FD_RETURN_IF_ERROR(target.Add("lm_head.weight", DType::kF32, lm_head.sizes().vec(),
                                lm_head.data_ptr(), lm_head.nbytes()));
  FD_RETURN_IF_ERROR(target.Write(o.out + "/target.safetensors"));
  // The manifest last: a folder without one is an unfinished write.
  FD_RETURN_IF_ERROR(writer.Finish());
  std::printf("wrote %lld samples to %s\n", static_cast<long long>(o.samples), o.out.c_str());
  return absl::OkStatus();
}

}  // namespace flashdraft
