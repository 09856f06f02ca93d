// Target forward throughput (hidden states of layers 1,3,5 + logits) of model/target_model on the
// folder written by bench/target_forward_bench.py, whose PyTorch eager run is the peer.
//   target_forward_bench DIR [--threads 2] [--batch 4] [--seq 256] [--repeats 5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "model/target_model.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: target_forward_bench DIR [--threads N] [--batch B] [--seq S]\n");
    return 2;
  }
  int64_t threads = 2, batch = 4, seq = 256, repeats = 5;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int64_t v = std::stoll(argv[i + 1]);
    if (flag == "--threads") threads = v;
    if (flag == "--batch") batch = v;
    if (flag == "--seq") seq = v;
    if (flag == "--repeats") repeats = v;
  }
  torch::set_num_threads(static_cast<int>(threads));
  auto model = flashdraft::TargetModel::Load(argv[1]);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const torch::Tensor ids =
      torch::randint(0, (*model)->config().vocab_size, {batch, seq}, torch::kInt64);
  auto run = [&] { return (*model)->Forward(ids, {1, 3, 5}, true).ok(); };
  run();
  double best = 1e9;
  for (int64_t r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!run()) return 1;
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("cpp tokens_per_s=%.0f\n", batch * seq / best);
  return 0;
}
