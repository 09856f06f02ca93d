#include "model/numeric_probe.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/version.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace flashdraft {
namespace {

// A value of at::show_config()'s "Build settings: A=x, B=y, ..." line ("" when absent).
std::string BuildSetting(const std::string& config, const std::string& key) {
  const size_t at = config.find(absl::StrCat(" ", key, "="));
  if (at == std::string::npos) return "";
  const size_t start = at + key.size() + 2;
  const size_t end = config.find_first_of(",\n", start);
  return std::string(absl::StripAsciiWhitespace(
      config.substr(start, end == std::string::npos ? end : end - start)));
}

}  // namespace

NumericEnv ProbeNumericEnv(const std::string& gpu, bool on_gpu) {
  NumericEnv env;
  env.torch = TORCH_VERSION;
  const std::string config = at::show_config();
  // ATen's own vectorized kernels (softmax, exp, reductions) follow the CPU capability it picked:
  // "CPU capability usage: AVX2" (ATEN_CPU_CAPABILITY chooses another).
  std::string capability;
  for (absl::string_view line : absl::StrSplit(config, '\n')) {
    if (absl::ConsumePrefix(&line, "  - CPU capability usage: ")) {
      capability = std::string(absl::StripAsciiWhitespace(line));
    }
  }
  const std::string cuda = BuildSetting(config, "CUDA_VERSION");
  env.torch_build = BuildSetting(config, "USE_CUDA") == "ON"
                        ? absl::StrCat("cuda ", cuda.empty() ? "?" : cuda)
                        : "cpu";
  if (!capability.empty()) absl::StrAppend(&env.torch_build, ", ", capability);
  ProbeBlas(env);
  env.cpu = CpuModelName();
  env.gpu = gpu;
  SanitizeNumericEnv(env);
  env.device = ComputeDevice(env.gpu, on_gpu);
  return env;
}

void PinComputeThreads(int threads) {
  at::set_num_threads(std::max(1, threads));
  PinBlasThreads(threads);
}

}  // namespace flashdraft
