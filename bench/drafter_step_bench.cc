// Drafter training step (forward + backward + AdamW) at a CPU-sized config, and peak RSS.
// Its peer, bench/drafter_step_bench.py (PyTorch eager on the same LibTorch, same config and
// threads), runs in the same invocation of bench/drafter_step_bench.sh, which prints both.
//
//   drafter_step_bench [--threads 2] [--steps 10] [--hidden 256] [--layers 2] [--block 16]
//                      [--seq 512] [--anchors 64] [--batch 2] [--vocab 8192]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "model/synthetic_data.h"
#include "model/trainer.h"

int main(int argc, char** argv) {
  int64_t threads = 2, steps = 10, hidden = 256, layers = 2, block = 16, seq = 512, anchors = 64,
          batch = 2, vocab = 8192;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int64_t v = std::stoll(argv[i + 1]);
    if (flag == "--threads")
      threads = v;
    else if (flag == "--steps")
      steps = v;
    else if (flag == "--hidden")
      hidden = v;
    else if (flag == "--layers")
      layers = v;
    else if (flag == "--block")
      block = v;
    else if (flag == "--seq")
      seq = v;
    else if (flag == "--anchors")
      anchors = v;
    else if (flag == "--batch")
      batch = v;
    else if (flag == "--vocab")
      vocab = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  torch::set_num_threads(static_cast<int>(threads));
  using namespace flashdraft;
  SyntheticLanguage lang = MakeSyntheticLanguage(vocab, 2 * hidden, 0.1, 0);
  DrafterModelConfig config = SyntheticDrafterConfig(lang, block, hidden, layers);
  config.num_attention_heads = hidden / 64;
  config.num_key_value_heads = std::max<int64_t>(1, config.num_attention_heads / 2);
  config.head_dim = 64;
  Drafter drafter(config);
  drafter->InitWeights(0);
  drafter->SetFrozen(torch::randn({vocab, hidden}) * 0.2, torch::randn({vocab, hidden}) * 0.2);
  OptimizerOptions opt;
  opt.learning_rate = 6e-4;
  opt.total_steps = 1000;
  DrafterTrainer trainer(drafter, opt);
  SyntheticBatchOptions bo;
  bo.batch = batch;
  bo.seq_len = seq;
  bo.max_anchors = anchors;
  bo.prompt_len = 0;
  bo.variable_length = false;
  DrafterBatch data = MakeSyntheticBatch(lang, bo, 0, 0);
  const double gamma = block == 16 ? 7.0 : block == 10 ? 5.0 : 4.0;

  std::vector<double> times;
  for (int64_t s = 0; s < steps + 2; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    DrafterLossResult r = trainer.Accumulate(data, gamma);
    trainer.Apply(s + 1);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= 2) times.push_back(dt);  // two warm-up steps
  }
  std::sort(times.begin(), times.end());
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  // One machine-readable line; the .sh driver prints the table.
  std::printf("cpp median_step_s=%.4f min_step_s=%.4f peak_rss_mib=%.0f\n", times[times.size() / 2],
              times.front(), usage.ru_maxrss / 1024.0);
  return 0;
}
