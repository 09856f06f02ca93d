#include "cli/make_target.h"

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/hf_folder.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "model/target_model.h"

namespace flashdraft {
namespace {

using json = nlohmann::json;

// The published configs' fields that decide tensor shapes and numerics.
struct TargetShape {
  const char* name;
  const char* model_type;
  int64_t hidden, intermediate, layers, heads, kv_heads, head_dim, vocab;
  bool tied;
  double rope_theta, rms_norm_eps;
  bool llama3_rope_scaling;  // factor 8, low 1, high 4, original 8192 (Llama 3.1)
  int64_t max_position;
};

constexpr TargetShape kShapes[] = {
    {"qwen3-0.6b", "qwen3", 1024, 3072, 28, 16, 8, 128, 151936, true, 1e6, 1e-6, false, 40960},
    {"qwen3-1.7b", "qwen3", 2048, 6144, 28, 16, 8, 128, 151936, true, 1e6, 1e-6, false, 40960},
    {"qwen3-4b", "qwen3", 2560, 9728, 36, 32, 8, 128, 151936, true, 1e6, 1e-6, false, 40960},
    {"qwen3-8b", "qwen3", 4096, 12288, 36, 32, 8, 128, 151936, false, 1e6, 1e-6, false, 40960},
    {"qwen3-14b", "qwen3", 5120, 17408, 40, 40, 8, 128, 151936, false, 1e6, 1e-6, false, 40960},
    {"qwen3-32b", "qwen3", 5120, 25600, 64, 64, 8, 128, 151936, false, 1e6, 1e-6, false, 40960},
    {"llama3-8b", "llama", 4096, 14336, 32, 32, 8, 128, 128256, false, 5e5, 1e-5, false, 8192},
    {"llama3.1-8b", "llama", 4096, 14336, 32, 32, 8, 128, 128256, false, 5e5, 1e-5, true, 131072},
    {"llama3.1-70b", "llama", 8192, 28672, 80, 64, 8, 128, 128256, false, 5e5, 1e-5, true, 131072},
};

const TargetShape* FindShape(const std::string& name) {
  for (const TargetShape& s : kShapes) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

json ConfigJson(const TargetShape& s, int64_t layers, const TrainedTokenizer& t,
                const std::string& dtype) {
  const bool qwen = std::string(s.model_type) == "qwen3";
  json c = {{"architectures", {qwen ? "Qwen3ForCausalLM" : "LlamaForCausalLM"}},
            {"model_type", s.model_type},
            {"hidden_size", s.hidden},
            {"intermediate_size", s.intermediate},
            {"num_hidden_layers", layers},
            {"num_attention_heads", s.heads},
            {"num_key_value_heads", s.kv_heads},
            {"head_dim", s.head_dim},
            {"vocab_size", s.vocab},
            {"max_position_embeddings", s.max_position},
            {"rms_norm_eps", s.rms_norm_eps},
            {"rope_theta", s.rope_theta},
            {"tie_word_embeddings", s.tied},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"hidden_act", "silu"},
            {"bos_token_id", t.endoftext},
            {"eos_token_id", t.im_end},
            {"torch_dtype", dtype == "bf16" ? "bfloat16" : "float32"}};
  if (s.llama3_rope_scaling) {
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
  }
  return c;
}

absl::Status CheckOptions(const MakeTargetOptions& o, const TargetShape* shape) {
  if (shape == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--shape '", o.shape, "' is not known (known: ",
                                                   absl::StrJoin(TargetShapeNames(), ", "), ")"));
  }
  if (o.out.empty()) return absl::InvalidArgumentError("--out is required");
  if (o.layers < 0 || o.layers > shape->layers) {
    return absl::InvalidArgumentError(absl::StrCat("--layers ", o.layers, " is outside [1, ",
                                                   shape->layers, "] for ", shape->name));
  }
  if (o.dtype != "bf16" && o.dtype != "fp32") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype '", o.dtype, "' is neither bf16 nor fp32"));
  }
  return absl::OkStatus();
}

// Random weights under Hugging Face's names (norms 1, matrices N(0, 0.02²) as the published
// models' initializer_range), checked by TargetModel's own loader; in `dtype`, in `out` order.
absl::StatusOr<std::map<std::string, torch::Tensor>> RandomWeights(const json& config,
                                                                   torch::ScalarType dtype,
                                                                   uint64_t seed) {
  FD_ASSIGN_OR_RETURN(TargetModelConfig tc, ParseTargetConfig(config.dump(), "make-target"));
  torch::manual_seed(seed);
  std::map<std::string, torch::Tensor> weights;
  auto get = [&](const std::string& name,
                 const std::vector<int64_t>& shape) -> absl::StatusOr<torch::Tensor> {
    const bool norm = name.find("norm") != std::string::npos;
    torch::Tensor t = norm ? torch::ones(shape) : torch::randn(shape) * 0.02;
    weights[name] = t.to(dtype).contiguous();
    return weights[name];
  };
  FD_RETURN_IF_ERROR(
      TargetModel::FromWeights(tc, get, [](const std::string&) { return false; }).status());
  return weights;
}

// long-chats.jsonl: 32 chats whose replies run on through the corpus for about `tokens` tokens
// (the prompt is the line before), so that jobs see sequences of the length they are sized for.
absl::Status WriteLongChats(const std::vector<std::string>& corpus, const Tokenizer& tokenizer,
                            int64_t tokens, const std::string& out) {
  constexpr int kChats = 32;
  std::vector<std::string> lines;
  for (const std::string& text : corpus) {
    for (size_t at = 0, next; at < text.size(); at = next + 1) {
      next = text.find('\n', at);
      if (next == std::string::npos) next = text.size();
      if (next > at) lines.push_back(text.substr(at, next - at));
    }
  }
  std::string chats;
  size_t i = 0;
  for (int c = 0; c < kChats && i + 1 < lines.size(); ++c) {
    const std::string prompt = "Continue: " + lines[i++];
    std::string reply;
    int64_t length = 0;
    while (i < lines.size() && length < tokens) {
      length += static_cast<int64_t>(tokenizer.Encode(lines[i] + "\n").size());
      reply += lines[i++] + "\n";
    }
    chats += json{{"messages",
                   {{{"role", "user"}, {"content", prompt}},
                    {{"role", "assistant"}, {"content", reply}}}}}
                 .dump() +
             "\n";
    if (i >= lines.size()) i = 0;  // round again
  }
  return WriteFileAtomically(out + "/long-chats.jsonl", chats);
}

}  // namespace

std::vector<std::string> TargetShapeNames() {
  std::vector<std::string> names;
  for (const TargetShape& s : kShapes) names.push_back(s.name);
  return names;
}

absl::Status MakeTarget(const MakeTargetOptions& o) {
  const TargetShape* shape = FindShape(o.shape);
  FD_RETURN_IF_ERROR(CheckOptions(o, shape));
  const int64_t layers = o.layers > 0 ? o.layers : shape->layers;
  const int64_t max_len = o.max_seq_len > 0 ? o.max_seq_len : 2048;
  FD_ASSIGN_OR_RETURN(std::vector<std::string> corpus, ReadCorpus(o.corpus_dir));
  const auto [digest, corpus_bytes] = CorpusDigest(corpus);
  const json stamp = {
      {"flashdraft_target", 2}, {"shape", shape->name},    {"layers", layers},
      {"dtype", o.dtype},       {"seed", o.seed},          {"merges", o.num_merges},
      {"max_seq_len", max_len}, {"corpus_crc32c", digest}, {"corpus_bytes", corpus_bytes}};
  const std::string stamp_path = o.out + "/flashdraft_target.json";
  if (!o.force) {
    absl::StatusOr<std::string> old = ReadFile(stamp_path);
    if (old.ok() && json::parse(*old, nullptr, false) == stamp) {
      std::printf("%s is up to date (same shape and options; --force makes it again)\n",
                  o.out.c_str());
      return absl::OkStatus();
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", o.out, ": ", ec.message()));
  std::remove(stamp_path.c_str());

  FD_ASSIGN_OR_RETURN(TrainedTokenizer tokenizer, TrainCorpusTokenizer(corpus, o.num_merges));
  if (tokenizer.tokenizer->vocab_size() >= shape->vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tokenizer's ", tokenizer.tokenizer->vocab_size(), " ids do not fit ",
                     shape->name, "'s vocabulary of ", shape->vocab));
  }
  const json config = ConfigJson(*shape, layers, tokenizer, o.dtype);
  const torch::ScalarType dtype = o.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  FD_ASSIGN_OR_RETURN(auto weights, RandomWeights(config, dtype, o.seed));
  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");
  int64_t params = 0, bytes = 0;
  for (const auto& [name, t] : weights) {
    FD_RETURN_IF_ERROR(writer.Add(name, dtype == torch::kBFloat16 ? DType::kBF16 : DType::kF32,
                                  t.sizes().vec(), t.data_ptr(), t.nbytes()));
    params += t.numel();
    bytes += t.nbytes();
  }
  FD_RETURN_IF_ERROR(writer.Write(o.out + "/model.safetensors"));
  FD_RETURN_IF_ERROR(WriteFileAtomically(o.out + "/config.json", config.dump(2) + "\n"));
  FD_RETURN_IF_ERROR(WriteTokenizerFiles(tokenizer, max_len, o.out));
  FD_RETURN_IF_ERROR(WriteDemoChats(corpus, o.out));
  FD_RETURN_IF_ERROR(WriteLongChats(corpus, *tokenizer.tokenizer, max_len, o.out));
  FD_RETURN_IF_ERROR(WriteFileAtomically(stamp_path, stamp.dump(2) + "\n"));
  std::printf(
      "wrote %s: %s shape, %lld of %lld layers, %.1f M parameters (%.2f GB %s), "
      "tokenizer of %d ids in a vocabulary of %lld\n",
      o.out.c_str(), shape->name, static_cast<long long>(layers),
      static_cast<long long>(shape->layers), params / 1e6, bytes / 1e9, o.dtype.c_str(),
      tokenizer.tokenizer->vocab_size(), static_cast<long long>(shape->vocab));
  return absl::OkStatus();
}

}  // namespace flashdraft
