// Drafter training step (forward + backward + AdamW) and the process's peak RSS, at any drafter
// shape: the defaults are a CPU-sized toy (bench/drafter_step_bench.sh), bench/real_shape_bench.sh
// passes Qwen3-0.6B's drafter. Its peer, bench/drafter_step_bench.py (PyTorch eager on the same
// LibTorch, same shape and threads), runs in the same invocation of the .sh, which prints both.
// With --tune-malloc 1 (the default) glibc keeps large blocks as flashdraft-worker has it do
// (common/malloc_tuning.h), so a step's 64 MiB logit chunks are not page-faulted and zeroed anew.
//
//   drafter_step_bench [--threads 2] [--steps 10] [--warmup 2] [--hidden 256] [--layers 2]
//                      [--heads H/64] [--kv-heads heads/2] [--head-dim 64] [--intermediate 3H]
//                      [--features 2] [--block 16] [--seq 512] [--anchors 64] [--batch 2]
//                      [--vocab 8192] [--tune-malloc 1] [--sliding-window 0]
// --sliding-window W > 0 makes every layer a sliding_attention layer of window W.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/malloc_tuning.h"
#include "model/anchors.h"
#include "model/trainer.h"

namespace {

using Flags = std::map<std::string, int64_t>;

// --name value pairs into `flags` (whose keys are the known names); false on an unknown one.
bool ParseFlags(int argc, char** argv, Flags& flags) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = std::string(argv[i]).substr(2);
    if (std::string(argv[i]).rfind("--", 0) != 0 || flags.count(name) == 0) {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return false;
    }
    flags[name] = std::stoll(argv[i + 1]);
  }
  return true;
}

flashdraft::DrafterModelConfig ConfigFrom(const Flags& f) {
  flashdraft::DrafterModelConfig c;
  c.hidden_size = f.at("hidden");
  c.intermediate_size = f.at("intermediate") > 0 ? f.at("intermediate") : 3 * c.hidden_size;
  c.num_hidden_layers = f.at("layers");
  c.head_dim = f.at("head-dim");
  c.num_attention_heads = f.at("heads") > 0 ? f.at("heads") : c.hidden_size / 64;
  c.num_key_value_heads =
      f.at("kv-heads") > 0 ? f.at("kv-heads") : std::max<int64_t>(1, c.num_attention_heads / 2);
  c.vocab_size = f.at("vocab");
  c.block_size = f.at("block");
  c.num_target_layers = 2 * f.at("features") + 2;
  c.max_position_embeddings = std::max<int64_t>(4096, f.at("seq"));
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.mask_token_id = c.vocab_size - 1;
  for (int64_t i = 0; i < f.at("features"); ++i) c.target_layer_ids.push_back(2 * i + 1);
  if (f.at("sliding-window") > 0) {
    c.layer_types.assign(static_cast<size_t>(c.num_hidden_layers), "sliding_attention");
    c.sliding_window = f.at("sliding-window");
  }
  return c;
}

// Random ids and features, every position trainable, anchors sampled as a job samples them (the
// synthetic language's feature table would hold vocab × features floats: 3 GB at Qwen3's shape).
flashdraft::DrafterBatch RandomBatch(const flashdraft::DrafterModelConfig& c, int64_t batch,
                                     int64_t seq, int64_t anchors) {
  torch::manual_seed(0);
  flashdraft::DrafterBatch b;
  b.input_ids = torch::randint(0, c.vocab_size - 1, {batch, seq}, torch::kInt64);
  b.loss_mask = torch::ones({batch, seq}, torch::kInt64);
  b.hidden_states =
      torch::randn({batch, seq, static_cast<int64_t>(c.target_layer_ids.size()) * c.hidden_size});
  std::vector<std::vector<int64_t>> masks(batch, std::vector<int64_t>(seq, 1));
  std::vector<uint64_t> ids(batch);
  for (int64_t i = 0; i < batch; ++i) ids[i] = i;
  const flashdraft::AnchorMatrix a = flashdraft::SampleBatchAnchors(masks, anchors, 0, 0, ids);
  b.anchors = torch::tensor(a.values, torch::kInt64).view({a.rows, a.cols});
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f = {{"threads", 2},       {"steps", 10},   {"warmup", 2},       {"hidden", 256},
             {"layers", 2},        {"heads", 0},    {"kv-heads", 0},     {"head-dim", 64},
             {"block", 16},        {"seq", 512},    {"anchors", 64},     {"batch", 2},
             {"vocab", 8192},      {"features", 2}, {"intermediate", 0}, {"tune-malloc", 1},
             {"sliding-window", 0}};
  if (!ParseFlags(argc, argv, f)) return 2;
  if (f["tune-malloc"] != 0) flashdraft::TuneMallocForStreaming();
  torch::set_num_threads(static_cast<int>(f["threads"]));
  using namespace flashdraft;
  const DrafterModelConfig config = ConfigFrom(f);
  Drafter drafter(config);
  drafter->InitWeights(0);
  const int64_t vocab = config.vocab_size, hidden = config.hidden_size;
  drafter->SetFrozen(torch::randn({vocab, hidden}) * 0.2, torch::randn({vocab, hidden}) * 0.2);
  OptimizerOptions opt;
  opt.learning_rate = 6e-4;
  opt.total_steps = 1000;
  DrafterTrainer trainer(drafter, opt);
  const DrafterBatch data = RandomBatch(config, f["batch"], f["seq"], f["anchors"]);
  const int64_t block = f["block"];
  const double gamma = block == 16 ? 7.0 : block == 10 ? 5.0 : 4.0;

  std::vector<double> times;
  for (int64_t s = 0; s < f["steps"] + f["warmup"]; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    trainer.Accumulate(data, gamma);
    trainer.Apply(s + 1);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= f["warmup"]) times.push_back(dt);
  }
  std::sort(times.begin(), times.end());
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  // One machine-readable line; the .sh driver prints the table.
  std::printf("cpp median_step_s=%.4f min_step_s=%.4f peak_rss_mib=%.0f\n", times[times.size() / 2],
              times.front(), usage.ru_maxrss / 1024.0);
  return 0;
}
