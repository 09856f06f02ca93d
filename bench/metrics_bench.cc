// What metrics cost a step: the coordinator's and a worker's per-step recording (what runs on
// their step paths whether anyone scrapes or not) and one scrape's serialization of each, in the
// same run as the peer — an empty loop of the same iterations. bench/metrics_bench.sh sets these
// against a real step time and runs the job with metrics on and off.
//
//   build/bin/metrics_bench [--iterations 200000] [--block-size 16]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "coordinator/metrics.h"
#include "coordinator/step_log.h"
#include "worker/worker_metrics.h"

namespace {

using Clock = std::chrono::steady_clock;

// Nanoseconds per call of `fn` over `n` calls, best of 3.
double Nanos(int64_t n, const std::function<void(int64_t)>& fn) {
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) fn(i);
    best = std::min(best, std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t iterations = 200000;
  int block_size = 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--iterations")) iterations = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--block-size")) block_size = std::atoi(argv[i + 1]);
  }
  flashdraft::CoordinatorMetrics coordinator("gloo", 1000000, block_size, "tls+token");
  flashdraft::WorkerMetrics worker("cpu", "gloo");
  flashdraft::StepRecord r;
  r.world_size = 4;
  r.tokens = 4096;
  r.loss = 2.5;
  r.slot_correct.assign(block_size - 1, 100);
  r.slot_total.assign(block_size - 1, 400);
  r.step_seconds = 0.2;
  r.wait_seconds = 0.001;
  r.forward_seconds = r.backward_seconds = 0.08;
  r.allreduce_seconds = 0.01;
  r.optimizer_seconds = 0.01;
  volatile int64_t sink = 0;
  const double empty = Nanos(iterations, [&](int64_t i) { sink = sink + i; });
  const double coordinator_step = Nanos(iterations, [&](int64_t i) {
    r.step = static_cast<uint64_t>(i);
    coordinator.RecordStep(r);
    coordinator.AddStreamBytes(1 << 20);  // one per microbatch sent; 4 a step here
    coordinator.AddStreamBytes(1 << 20);
    coordinator.AddStreamBytes(1 << 20);
    coordinator.AddStreamBytes(1 << 20);
  });
  const double worker_step = Nanos(iterations, [&](int64_t i) {
    worker.RecordStep(static_cast<uint64_t>(i), {0.001, 0.08, 0.08, 0.01, 0.01}, 1 << 20);
    worker.AddReceivedBytes(1 << 20);  // the heartbeat thread's 100 ms tick
    worker.SetQueuedMicrobatches(i % 4);
  });
  const int64_t scrapes = std::max<int64_t>(1, iterations / 100);
  size_t coordinator_bytes = 0, worker_bytes = 0;
  const double coordinator_scrape =
      Nanos(scrapes, [&](int64_t) { coordinator_bytes = coordinator.Text().size(); });
  const double worker_scrape =
      Nanos(scrapes, [&](int64_t) { worker_bytes = worker.Text().size(); });
  std::printf("metrics cost, block size %d, best of 3 x %lld iterations\n", block_size,
              static_cast<long long>(iterations));
  std::printf("%-52s %12s\n", "what", "time");
  std::printf("%-52s %9.1f ns\n", "empty loop iteration (the peer)", empty);
  std::printf("%-52s %9.1f ns\n", "coordinator: a committed step's recording", coordinator_step);
  std::printf("%-52s %9.1f ns\n", "worker: a step's recording + a 100 ms tick", worker_step);
  std::printf("%-52s %9.1f us  (%zu bytes)\n", "coordinator: one scrape's serialization",
              coordinator_scrape / 1000, coordinator_bytes);
  std::printf("%-52s %9.1f us  (%zu bytes)\n", "worker: one scrape's serialization",
              worker_scrape / 1000, worker_bytes);
  return 0;
}
