#include "cli/make_tiny_target.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/hf_folder.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/tokenizer.h"
#include "model/generate.h"
#include "model/numeric_probe.h"
#include "model/target_model.h"

namespace flashdraft {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json ConfigJson(const MakeTinyTargetOptions& o, int64_t vocab_size, int64_t eos, int64_t bos) {
  return json{{"architectures", {"Qwen3ForCausalLM"}},
              {"model_type", "qwen3"},
              {"hidden_size", o.hidden_size},
              {"intermediate_size", o.intermediate_size},
              {"num_hidden_layers", o.num_layers},
              {"num_attention_heads", o.num_heads},
              {"num_key_value_heads", o.num_kv_heads},
              {"head_dim", o.hidden_size / o.num_heads},
              {"vocab_size", vocab_size},
              {"max_position_embeddings", 2048},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 1000000.0},
              {"tie_word_embeddings", true},
              {"attention_bias", false},
              {"hidden_act", "silu"},
              {"bos_token_id", bos},
              {"eos_token_id", eos},
              {"torch_dtype", "float32"}};
}

absl::Status CheckShape(const MakeTinyTargetOptions& o) {
  if (o.out.empty()) return absl::InvalidArgumentError("--out is required");
  if (o.hidden_size <= 0 || o.num_heads <= 0 || o.num_kv_heads <= 0 || o.num_layers <= 0 ||
      o.hidden_size % o.num_heads != 0 || o.num_heads % o.num_kv_heads != 0 ||
      (o.hidden_size / o.num_heads) % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden size ", o.hidden_size, " must split into ", o.num_heads,
                     " heads of an even size, and the heads into ", o.num_kv_heads, " KV heads"));
  }
  return absl::OkStatus();
}

// Everything the result depends on; an equal stamp means the folder is up to date.
json Stamp(const MakeTinyTargetOptions& o, uint32_t corpus_digest, size_t corpus_bytes) {
  return {{"flashdraft_tiny_target", 2},
          {"corpus_crc32c", corpus_digest},
          {"corpus_bytes", corpus_bytes},
          {"merges", o.num_merges},
          {"hidden", o.hidden_size},
          {"layers", o.num_layers},
          {"heads", o.num_heads},
          {"kv_heads", o.num_kv_heads},
          {"intermediate", o.intermediate_size},
          {"steps", o.steps},
          {"batch", o.batch_size},
          {"seq_len", o.seq_len},
          {"lr", o.learning_rate},
          {"seed", o.seed},
          {"threads", o.threads}};
}

// The corpus as one stream of token ids, each text ended by `eos`.
std::vector<int64_t> TokenStream(const Tokenizer& tokenizer, const std::vector<std::string>& corpus,
                                 int64_t eos) {
  std::vector<int64_t> stream;
  for (const std::string& text : corpus) {
    for (int32_t id : tokenizer.Encode(text)) stream.push_back(id);
    stream.push_back(eos);
  }
  return stream;
}

// Linear warm-up over the first tenth of the steps, then a cosine down to 0.
double LearningRate(const MakeTinyTargetOptions& o, int64_t step) {
  const int64_t warmup = std::max<int64_t>(1, o.steps / 10);
  return step < warmup
             ? o.learning_rate * (step + 1) / warmup
             : o.learning_rate * 0.5 *
                   (1 + std::cos(M_PI * (step - warmup) / std::max<int64_t>(1, o.steps - warmup)));
}

// batch_size windows of seq_len + 1 tokens at random places in the stream.
torch::Tensor SampleBatch(const MakeTinyTargetOptions& o, const std::vector<int64_t>& stream,
                          std::mt19937_64& rng) {
  std::vector<int64_t> batch;
  for (int64_t b = 0; b < o.batch_size; ++b) {
    const size_t start = rng() % (stream.size() - o.seq_len - 1);
    batch.insert(batch.end(), stream.begin() + start, stream.begin() + start + o.seq_len + 1);
  }
  return torch::tensor(batch, torch::kInt64).view({o.batch_size, o.seq_len + 1});
}

// Hugging Face names, small normal init; `params` receives the weights by name.
absl::StatusOr<std::unique_ptr<TargetModel>> InitTinyModel(
    const json& config, std::map<std::string, torch::Tensor>& params) {
  FD_ASSIGN_OR_RETURN(TargetModelConfig tc, ParseTargetConfig(config.dump(), "tiny config"));
  auto get = [&](const std::string& name,
                 const std::vector<int64_t>& shape) -> absl::StatusOr<torch::Tensor> {
    const bool norm = name.find("norm") != std::string::npos;
    torch::Tensor t = norm ? torch::ones(shape) : torch::randn(shape) * 0.02;
    t.set_requires_grad(true);
    params[name] = t;
    return t;
  };
  return TargetModel::FromWeights(
      tc, get, [](const std::string&) { return false; }, /*trainable=*/true);
}

// Next-token training through TargetModel's own forward; the first and the last loss.
absl::StatusOr<std::pair<double, double>> TrainTinyModel(
    const MakeTinyTargetOptions& o, TargetModel& model,
    std::map<std::string, torch::Tensor>& params, const std::vector<int64_t>& stream,
    int64_t vocab_size) {
  std::vector<torch::Tensor> all;
  for (auto& [name, t] : params) all.push_back(t);
  torch::optim::AdamW optimizer(
      all, torch::optim::AdamWOptions(o.learning_rate).betas({0.9, 0.95}).weight_decay(0.01));
  std::mt19937_64 rng(o.seed);
  double first_loss = 0, last_loss = 0;
  Progress progress = Progress::ForStream("training the tiny target", static_cast<double>(o.steps),
                                          "steps", stdout);
  for (int64_t step = 0; step < o.steps; ++step) {
    const torch::Tensor tokens = SampleBatch(o, stream, rng);
    FD_ASSIGN_OR_RETURN(TargetOutput out,
                        model.Forward(tokens.narrow(1, 0, o.seq_len), {}, /*with_logits=*/true));
    const torch::Tensor loss = torch::nn::functional::cross_entropy(
        out.logits.reshape({-1, vocab_size}), tokens.narrow(1, 1, o.seq_len).reshape(-1));
    const double lr = LearningRate(o, step);
    for (auto& group : optimizer.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    optimizer.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(all, 1.0);
    optimizer.step();
    last_loss = loss.item<double>();
    if (step == 0) first_loss = last_loss;
    progress.Update(static_cast<double>(step + 1), absl::StrFormat("loss %.4f", last_loss));
  }
  progress.Finish();
  return std::make_pair(first_loss, last_loss);
}

// model.safetensors, config.json and the tokenizer's files.
absl::Status WriteTinyFolder(const std::string& out,
                             const std::map<std::string, torch::Tensor>& params, const json& config,
                             const TrainedTokenizer& trained) {
  SafetensorsWriter weights;
  for (auto& [name, t] : params) {
    const torch::Tensor c = t.detach().contiguous();
    FD_RETURN_IF_ERROR(weights.Add(name, DType::kF32, c.sizes().vec(), c.data_ptr(), c.nbytes()));
  }
  FD_RETURN_IF_ERROR(weights.Write(out + "/model.safetensors"));
  FD_RETURN_IF_ERROR(WriteFileAtomically(out + "/config.json", config.dump(2) + "\n"));
  return WriteTokenizerFiles(trained, 2048, out);
}

}  // namespace

absl::Status MakeTinyTarget(const MakeTinyTargetOptions& o) {
  FD_RETURN_IF_ERROR(CheckShape(o));
  FD_ASSIGN_OR_RETURN(std::vector<std::string> corpus, ReadCorpus(o.corpus_dir));
  const auto [digest, corpus_bytes] = CorpusDigest(corpus);
  const json stamp = Stamp(o, digest, corpus_bytes);
  const std::string stamp_path = o.out + "/flashdraft_tiny_target.json";
  if (!o.force) {
    absl::StatusOr<std::string> old = ReadFile(stamp_path);
    if (old.ok() && json::parse(*old, nullptr, false) == stamp) {
      FD_RETURN_IF_ERROR(WriteDemoChats(corpus, o.out));
      std::printf("%s is up to date (same corpus and options; --force retrains)\n", o.out.c_str());
      return absl::OkStatus();
    }
  }
  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", o.out, ": ", ec.message()));
  std::remove(stamp_path.c_str());
  const auto t0 = std::chrono::steady_clock::now();

  // 1. Tokenizer.
  FD_ASSIGN_OR_RETURN(TrainedTokenizer trained, TrainCorpusTokenizer(corpus, o.num_merges));
  const Tokenizer* tokenizer = trained.tokenizer.get();
  const int64_t eos = trained.endoftext;
  // Room after the tokenizer's ids (the drafter's mask token is the first unused row).
  const int64_t vocab_size = (tokenizer->vocab_size() + 64) / 64 * 64;
  const std::vector<int64_t> stream = TokenStream(*tokenizer, corpus, eos);
  std::printf("tokenizer: %d merges, %d ids; corpus %zu bytes -> %zu tokens\n", o.num_merges,
              tokenizer->vocab_size(), corpus_bytes, stream.size());
  if (static_cast<int64_t>(stream.size()) <= o.seq_len + 1) {
    return absl::InvalidArgumentError("the corpus is shorter than one training sequence");
  }

  // 2. Model.
  torch::manual_seed(o.seed);
  PinComputeThreads(o.threads);
  const json config = ConfigJson(o, vocab_size, eos, eos);
  std::map<std::string, torch::Tensor> params;
  FD_ASSIGN_OR_RETURN(auto model, InitTinyModel(config, params));
  FD_ASSIGN_OR_RETURN(const auto losses, TrainTinyModel(o, *model, params, stream, vocab_size));

  // 3. The folder, and a greedy continuation to show what the target learned.
  FD_RETURN_IF_ERROR(WriteTinyFolder(o.out, params, config, trained));
  std::vector<int32_t> prompt32 = tokenizer->Encode("This License");
  FD_ASSIGN_OR_RETURN(std::vector<int64_t> more,
                      GreedyGenerate(*model, {prompt32.begin(), prompt32.end()}, 24, {eos}));
  std::vector<int32_t> more32(more.begin(), more.end());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("loss %.4f -> %.4f in %lld steps, %.0f s\n", losses.first, losses.second,
              static_cast<long long>(o.steps), seconds);
  std::printf("greedy: \"This License%s\"\n", tokenizer->Decode(more32).c_str());
  FD_RETURN_IF_ERROR(WriteDemoChats(corpus, o.out));
  FD_RETURN_IF_ERROR(WriteFileAtomically(stamp_path, stamp.dump(2) + "\n"));
  std::printf("wrote %s\n", o.out.c_str());
  return absl::OkStatus();
}

}  // namespace flashdraft
