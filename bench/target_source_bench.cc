// Features/s the online target source delivers (coordinator/sources/target_source.h): on demand
// (Get computes inline) and ahead of demand (Prefetch on the background thread, then Get). Its
// peer, what one worker consumes, is measured by bench/target_source_bench.sh in the same run.
//
//   target_source_bench --target DIR --data chats.jsonl [--layers 1,3] [--samples 64]
#include <chrono>
#include <cstdio>
#include <string>

#include "coordinator/sources/target_source.h"

namespace {
using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

int main(int argc, char** argv) {
  flashdraft::TargetSourceOptions o;
  uint64_t samples = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--target") o.target.target_dir = value;
    if (flag == "--data") o.data = {{value, 1.0}};
    if (flag == "--samples") samples = std::stoull(value);
    if (flag == "--layers") {
      for (size_t at = 0; at < value.size();) {
        size_t comma = value.find(',', at);
        if (comma == std::string::npos) comma = value.size();
        o.target.layer_ids.push_back(std::stoi(value.substr(at, comma - at)));
        at = comma + 1;
      }
    }
  }
  if (o.target.layer_ids.empty()) o.target.layer_ids = {1, 3};
  o.max_cached = 1 << 20;
  auto source = flashdraft::TargetModelSource::Open(o);
  if (!source.ok()) {
    std::fprintf(stderr, "target_source_bench: %s\n",
                 std::string(source.status().message()).c_str());
    return 1;
  }
  const uint64_t n = std::min<uint64_t>(samples, (*source)->num_samples());
  auto run = [&](uint64_t first, bool prefetch) {
    std::vector<uint64_t> indices;
    for (uint64_t i = first; i < first + n; ++i) indices.push_back(i % (*source)->num_samples());
    const auto t0 = Clock::now();
    if (prefetch) (*source)->Prefetch(indices);
    int64_t tokens = 0;
    for (uint64_t i : indices) {
      auto s = (*source)->Get(i);
      if (!s.ok()) {
        std::fprintf(stderr, "target_source_bench: %s\n",
                     std::string(s.status().message()).c_str());
        std::exit(1);
      }
      tokens += s->length();
    }
    return tokens / Since(t0);
  };
  run(0, false);  // warm-up
  const double on_demand = run(0, false);
  const double ahead = run(n, true);
  std::printf("target source: %s, layers", o.target.target_dir.c_str());
  for (int l : o.target.layer_ids) std::printf(" %d", l);
  std::printf(", %llu samples, BF16 features\n", static_cast<unsigned long long>(n));
  std::printf("%-44s %12s\n", "path", "tokens/s");
  std::printf("%-44s %12.0f\n", "source, on demand (Get computes)", on_demand);
  std::printf("%-44s %12.0f\n", "source, announced ahead (Prefetch, then Get)", ahead);
  return 0;
}
