// The drafter's training step on a GPU at the Qwen3-8B DFlash shape (5 layers, hidden 4096, 32/8
// heads of 128, intermediate 12288, vocabulary 151936, block 16, 5 target features, S 3072,
// 512 anchors): B samples per step (one microbatch each, gradients accumulated, then AdamW), in
// bf16 (train.precision: bf16) and, as its peer in the same run, in fp32 (fewer samples: it is
// several times slower). Prints samples/s, tokens/s, model TFLOP/s, MFU against the GPU's dense
// bf16 peak, peak device memory (RESULTS.md compares with SpecForge and TorchSpec), and what
// copying a received batch to the device costs as a share of the step.
//
//   gpu_step_bench [--device cuda|cpu] [--preset qwen3-8b|tiny] [--batch 16] [--fp32-batch 2]
//                  [--steps 3] [--peak-tflops 989]
//
// Model FLOPs per sample (matrix products, 2mnk; backward = 2x forward for trained weights):
// fc, the context K/V projections, the block tokens' projections and MLP, the attention (each
// query over the context before its anchor and its own block) and lm_head over the weighted rows
// (its gradient formed in forward: 2 products, no weight gradient). `--preset tiny` runs the CPU
// demo's shape, so the program is checked where there is no GPU.
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "model/trainer.h"

#if FLASHDRAFT_TORCH_CUDA  // a CUDA LibTorch (bench/CMakeLists.txt): its allocator's peak
#include <c10/cuda/CUDACachingAllocator.h>
#define FD_HAVE_CUDA_ALLOCATOR 1
#endif

namespace {

using flashdraft::DrafterBatch;
using flashdraft::DrafterModelConfig;

struct Shape {
  int64_t hidden, heads, kv_heads, head_dim, intermediate, vocab, layers, block, features, seq,
      anchors;
};

Shape Preset(const std::string& name) {
  if (name == "tiny") return {128, 4, 2, 32, 384, 832, 1, 8, 2, 256, 16};
  return {4096, 32, 8, 128, 12288, 151936, 5, 16, 5, 3072, 512};
}

DrafterModelConfig ConfigOf(const Shape& s) {
  DrafterModelConfig c;
  c.hidden_size = s.hidden;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.intermediate_size = s.intermediate;
  c.vocab_size = s.vocab;
  c.num_hidden_layers = s.layers;
  c.block_size = s.block;
  c.num_target_layers = 36;
  c.target_layer_ids.clear();
  for (int64_t i = 0; i < s.features; ++i) c.target_layer_ids.push_back(1 + 8 * i);
  c.max_position_embeddings = 40960;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.mask_token_id = s.vocab - 1;
  return c;
}

// Anchors spread evenly over [0, S-2] (every block fully inside the sample).
DrafterBatch MakeBatch(const Shape& s, const torch::Device& device, uint64_t seed) {
  torch::manual_seed(seed);
  DrafterBatch b;
  b.input_ids = torch::randint(0, s.vocab - 1, {1, s.seq}, torch::kInt64).to(device);
  b.loss_mask = torch::ones({1, s.seq}, torch::kInt64).to(device);
  b.hidden_states = torch::randn({1, s.seq, s.features * s.hidden}, torch::kBFloat16).to(device);
  const int64_t last = s.seq - s.block - 1;
  b.anchors = torch::linspace(0, static_cast<double>(last), s.anchors)
                  .to(torch::kInt64)
                  .unsqueeze(0)
                  .to(device);
  return b;
}

// Forward + backward model FLOPs of one sample (see the header).
double TrainFlops(const Shape& s) {
  const double t = static_cast<double>(s.anchors * s.block), S = static_cast<double>(s.seq);
  const double h = s.hidden, q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  const double rows = static_cast<double>(s.anchors * (s.block - 1));
  const double fc = 2 * S * s.features * h * h;
  const double avg_context = S / 2 + s.block;  // anchors spread evenly
  const double per_layer = 2 * t * h * (q + 2 * kv) + 2 * S * h * 2 * kv + 2 * t * q * h +
                           2 * t * h * 3 * s.intermediate + 2 * 2 * t * avg_context * q;
  const double head = 2 * rows * h * s.vocab;
  return 2 * fc + 3 * s.layers * per_layer + 2 * head;
}

void Synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

struct Result {
  double samples_per_second = 0, peak_gib = -1;
  double h2d_seconds_per_sample = -1;  // one sample's batch, pinned host memory -> device
};

// What the worker's copy of a received batch costs: one sample's tensors from pinned host memory
// to the device (the worker queues it non-blocking on the default stream, not overlapped with the
// previous step; this says how much overlapping could win).
double H2dSecondsPerSample(const Shape& s, const torch::Device& device) {
  DrafterBatch host = MakeBatch(s, torch::kCPU, 1);
  for (torch::Tensor* t : {&host.input_ids, &host.loss_mask, &host.hidden_states, &host.anchors}) {
    *t = t->pin_memory();
  }
  auto copy = [&] {
    for (const torch::Tensor& t :
         {host.input_ids, host.loss_mask, host.hidden_states, host.anchors}) {
      (void)t.to(device, /*non_blocking=*/true);
    }
  };
  copy();  // warm-up
  Synchronize(device);
  constexpr int kCopies = 8;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kCopies; ++i) copy();
  Synchronize(device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kCopies;
}

Result Run(const Shape& s, const torch::Device& device, torch::ScalarType compute, int64_t batch,
           int64_t steps) {
  using namespace flashdraft;
  Drafter drafter(ConfigOf(s));
  drafter->InitWeights(0);
  drafter->MoveTo(device);
  drafter->SetFrozen(
      torch::randn({s.vocab, s.hidden}, torch::TensorOptions().device(device)) * 0.02,
      torch::randn({s.vocab, s.hidden}, torch::TensorOptions().device(device)) * 0.02);
  drafter->SetComputeDtype(compute);
  // Larger score chunks than the CPU default: the GPU has the memory and wants the work.
  drafter->attention_options.chunk_score_bytes = device.is_cuda() ? int64_t{1} << 30 : 64 << 20;
  OptimizerOptions opt;
  opt.total_steps = steps + 1;
  DrafterTrainer trainer(drafter, opt);
  std::vector<DrafterBatch> batches;
  for (int64_t i = 0; i < batch; ++i) batches.push_back(MakeBatch(s, device, i));
  auto step = [&](int64_t n) {
    const double normaliser = static_cast<double>(batch * s.anchors * (s.block - 1));
    for (const DrafterBatch& b : batches) trainer.Accumulate(b, 7.0, normaliser);
    trainer.Apply(n);
  };
  step(0);  // warm-up: allocator, kernels, optimizer state
  Synchronize(device);
#ifdef FD_HAVE_CUDA_ALLOCATOR
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
  const auto start = std::chrono::steady_clock::now();
  for (int64_t n = 1; n <= steps; ++n) step(n);
  Synchronize(device);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Result r;
  r.samples_per_second = static_cast<double>(batch * steps) / seconds;
#ifdef FD_HAVE_CUDA_ALLOCATOR
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    r.peak_gib = static_cast<double>(stats.allocated_bytes[0].peak) / (1 << 30);
  }
#endif
  if (device.is_cuda()) r.h2d_seconds_per_sample = H2dSecondsPerSample(s, device);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = "cuda", preset = "qwen3-8b";
  int64_t batch = 16, fp32_batch = 2, steps = 3;
  double peak_tflops = 989.0;  // H100/H200 SXM dense bf16
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--device") {
      device_name = value;
    } else if (flag == "--preset") {
      preset = value;
    } else if (flag == "--batch") {
      batch = std::stoll(value);
    } else if (flag == "--fp32-batch") {
      fp32_batch = std::stoll(value);
    } else if (flag == "--steps") {
      steps = std::stoll(value);
    } else if (flag == "--peak-tflops") {
      peak_tflops = std::stod(value);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (device_name == "cuda" && !torch::cuda::is_available()) {
    std::fprintf(stderr,
                 "gpu_step_bench: no CUDA device for this LibTorch (needs a CUDA LibTorch and a "
                 "GPU; --device cpu --preset tiny runs the CPU demo shape)\n");
    return 77;
  }
  const torch::Device device =
      device_name == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  const Shape s = Preset(preset);
  const double flops = TrainFlops(s);
  std::printf(
      "drafter training step, %s shape: %ld layers, hidden %ld, S %ld, %ld anchors x block "
      "%ld, vocabulary %ld; %.4g model TFLOP per sample (train)\n",
      preset.c_str(), static_cast<long>(s.layers), static_cast<long>(s.hidden),
      static_cast<long>(s.seq), static_cast<long>(s.anchors), static_cast<long>(s.block),
      static_cast<long>(s.vocab), flops / 1e12);
  std::printf("%-6s %8s %10s %12s %10s %8s %10s %14s\n", "prec", "samples", "samples/s", "tokens/s",
              "TFLOP/s", "MFU", "peak GiB", "H2D % of step");
  for (const auto& [name, compute, n] :
       {std::tuple<const char*, torch::ScalarType, int64_t>{"bf16", torch::kBFloat16, batch},
        {"fp32", torch::kFloat32, fp32_batch}}) {
    const Result r = Run(s, device, compute, n, steps);
    const double tflops = r.samples_per_second * flops / 1e12;
    const std::string h2d =
        r.h2d_seconds_per_sample < 0
            ? "n/a"
            : absl::StrFormat("%.1f%%", 100 * r.h2d_seconds_per_sample * r.samples_per_second);
    std::printf("%-6s %8ld %10.2f %12.0f %10.4g %7.2f%% %10s %14s\n", name, static_cast<long>(n),
                r.samples_per_second, r.samples_per_second * static_cast<double>(s.seq), tflops,
                100 * tflops / peak_tflops,
                r.peak_gib < 0 ? "n/a" : std::to_string(r.peak_gib).substr(0, 6).c_str(),
                h2d.c_str());
  }
  std::printf("MFU against %.0f TFLOP/s dense bf16 (fp32 rows: the same yardstick)\n", peak_tflops);
  return 0;
}
