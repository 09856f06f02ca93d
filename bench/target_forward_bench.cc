// Target forward throughput and peak RSS of model/target_model on the folder written by
// bench/target_forward_bench.py, whose PyTorch eager run is the peer: the hidden states of the
// feature layers (the same rule as the peer: up to 5 layers spread over the model, or 1,3,5 on the
// default toy) and, with --logits 1, the logits.
//   target_forward_bench DIR [--threads 2] [--batch 4] [--seq 256] [--repeats 5] [--logits 1]
//                            [--warmup 1]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "model/target_model.h"

namespace {

// The peer's FeatureLayers: 1,3,5 on a model of 8 layers, else min(5, L) layers spread evenly.
std::vector<int> FeatureLayers(int64_t layers) {
  if (layers == 8) return {1, 3, 5};
  const int64_t n = std::min<int64_t>(5, layers);
  std::vector<int> ids;
  for (int64_t i = 0; i < n; ++i) {
    const int id = static_cast<int>(n == 1 ? 0 : (i * (layers - 1) + (n - 1) / 2) / (n - 1));
    if (ids.empty() || ids.back() != id) ids.push_back(id);
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: target_forward_bench DIR [--threads N] [--batch B] [--seq S]\n");
    return 2;
  }
  int64_t threads = 2, batch = 4, seq = 256, repeats = 5, logits = 1, warmup = 1;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int64_t v = std::stoll(argv[i + 1]);
    if (flag == "--threads") threads = v;
    if (flag == "--batch") batch = v;
    if (flag == "--seq") seq = v;
    if (flag == "--repeats") repeats = v;
    if (flag == "--logits") logits = v;
    if (flag == "--warmup") warmup = v;
  }
  torch::set_num_threads(static_cast<int>(threads));
  auto model = flashdraft::TargetModel::Load(argv[1]);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const torch::Tensor ids =
      torch::randint(0, (*model)->config().vocab_size, {batch, seq}, torch::kInt64);
  const std::vector<int> layers = FeatureLayers((*model)->config().num_hidden_layers);
  auto run = [&] { return (*model)->Forward(ids, layers, logits != 0).ok(); };
  for (int64_t w = 0; w < warmup; ++w) run();
  double best = 1e9;
  for (int64_t r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!run()) return 1;
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  std::printf("cpp tokens_per_s=%.1f best_s=%.3f peak_rss_mib=%.0f\n", batch * seq / best, best,
              usage.ru_maxrss / 1024.0);
  return 0;
}
