#include "common/numeric_env.h"

#include <dlfcn.h>
#include <glog/logging.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "flashdraft/v1/coordinator.pb.h"

extern char** environ;

namespace flashdraft {
namespace {

constexpr size_t kMaxFieldChars = 256;
constexpr size_t kMaxBlasEnv = 16;
constexpr size_t kMaxGpuChars = 200;  // the device field is "cuda " + gpu
// Set in the environment of a process that started itself again for train.blas_kernel.
constexpr const char* kPinnedMarker = "FLASHDRAFT_BLAS_PINNED";

// OpenBLAS's own C entry points, looked up where the process loaded it (LibTorch links the BLAS
// behind libblas.so.3, so OpenBLAS is not named at link time).
template <typename Fn>
Fn OpenBlasSymbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

void Sanitize(std::string& s, size_t max_chars) {
  if (s.size() > max_chars) s.resize(max_chars);
  for (char& c : s) {
    if (c < 0x20 || c >= 0x7f) c = '?';
  }
}

// The fields compared by NumericDifferences, by name.
std::vector<std::pair<const char*, const std::string NumericEnv::*>> ComparedFields() {
  return {{"torch", &NumericEnv::torch},
          {"torch_build", &NumericEnv::torch_build},
          {"blas", &NumericEnv::blas},
          {"blas_core", &NumericEnv::blas_core},
          {"device", &NumericEnv::device}};
}

std::vector<std::pair<const char*, std::string NumericEnv::*>> TextFields() {
  return {{"torch", &NumericEnv::torch},   {"torch_build", &NumericEnv::torch_build},
          {"blas", &NumericEnv::blas},     {"blas_core", &NumericEnv::blas_core},
          {"device", &NumericEnv::device}, {"cpu", &NumericEnv::cpu},
          {"gpu", &NumericEnv::gpu}};
}

}  // namespace

void ProbeBlas(NumericEnv& env) {
  using StringFn = char* (*)();
  using IntFn = int (*)();
  env.blas.clear();
  env.blas_core.clear();
  env.blas_threads = 0;
  if (auto config = OpenBlasSymbol<StringFn>("openblas_get_config"); config != nullptr) {
    // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64": the library and version.
    const std::vector<std::string> words = absl::StrSplit(config(), ' ', absl::SkipEmpty());
    env.blas = words.size() >= 2 ? absl::StrCat(words[0], " ", words[1]) : "OpenBLAS";
  }
  if (auto core = OpenBlasSymbol<StringFn>("openblas_get_corename"); core != nullptr) {
    env.blas_core = std::string(absl::StripAsciiWhitespace(core()));
  }
  if (auto threads = OpenBlasSymbol<IntFn>("openblas_get_num_threads"); threads != nullptr) {
    env.blas_threads = threads();
  }
  env.blas_env.clear();
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (absl::StartsWith(*e, "OPENBLAS_")) env.blas_env.emplace_back(*e);
  }
  std::sort(env.blas_env.begin(), env.blas_env.end());
}

void SanitizeNumericEnv(NumericEnv& env) {
  for (const auto& [name, field] : TextFields()) {
    Sanitize(env.*field, field == &NumericEnv::gpu ? kMaxGpuChars : kMaxFieldChars);
  }
  if (env.blas_env.size() > kMaxBlasEnv) env.blas_env.resize(kMaxBlasEnv);
  for (std::string& e : env.blas_env) Sanitize(e, kMaxFieldChars);
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "model name")) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
  }
  return "";
}

std::vector<std::string> NumericDifferences(const NumericEnv& mine, const NumericEnv& theirs) {
  std::vector<std::string> out;
  for (const auto& [name, field] : ComparedFields()) {
    if (mine.*field != theirs.*field) {
      out.push_back(absl::StrCat(name, " '", mine.*field, "' != '", theirs.*field, "'"));
    }
  }
  return out;
}

std::string DescribeNumericEnv(const NumericEnv& env) {
  std::string out = absl::StrCat("LibTorch ", env.torch, " (", env.torch_build, "), ");
  if (env.blas.empty()) {
    absl::StrAppend(&out, "BLAS not OpenBLAS (its kernel is not known)");
  } else {
    absl::StrAppend(&out, env.blas, " kernel ", env.blas_core, ", ", env.blas_threads,
                    " BLAS thread(s)");
  }
  if (!env.blas_env.empty()) absl::StrAppend(&out, ", ", absl::StrJoin(env.blas_env, " "));
  absl::StrAppend(&out, ", ", env.device);
  if (!env.cpu.empty()) absl::StrAppend(&out, " (", env.cpu, ")");
  return out;
}

std::string NumericEnvProbeLines(const NumericEnv& env) {
  return absl::StrCat("torch: ", env.torch, " ", env.torch_build, "\nblas: ", env.blas,
                      "\nblas_core: ", env.blas_core, "\nblas_threads: ", env.blas_threads,
                      "\nblas_env: ", absl::StrJoin(env.blas_env, " "), "\ncpu: ", env.cpu,
                      "\ngpu: ", env.gpu, "\n");
}

std::vector<std::pair<std::string, std::string>> NumericEnvLabels(const NumericEnv& env) {
  return {{"torch", absl::StrCat(env.torch, " ", env.torch_build)},
          {"blas", env.blas},
          {"blas_kernel", env.blas_core}};
}

nlohmann::json NumericEnvToJson(const NumericEnv& env) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, field] : TextFields()) j[name] = env.*field;
  j["blas_threads"] = env.blas_threads;
  j["blas_env"] = env.blas_env;
  return j;
}

absl::StatusOr<NumericEnv> NumericEnvFromJson(const nlohmann::json& j, const std::string& what) {
  if (!j.is_object()) return absl::DataLossError(absl::StrCat(what, ": not an object"));
  NumericEnv env;
  for (const auto& [name, field] : TextFields()) {
    if (!j.contains(name)) continue;
    if (!j[name].is_string()) {
      return absl::DataLossError(absl::StrCat(what, ": '", name, "' is not a string"));
    }
    env.*field = j[name].get<std::string>();
  }
  if (j.contains("blas_threads")) {
    if (!j["blas_threads"].is_number_integer()) {
      return absl::DataLossError(absl::StrCat(what, ": 'blas_threads' is not an integer"));
    }
    env.blas_threads =
        static_cast<int>(std::clamp<int64_t>(j["blas_threads"].get<int64_t>(), 0, 1 << 20));
  }
  if (j.contains("blas_env")) {
    if (!j["blas_env"].is_array() || j["blas_env"].size() > kMaxBlasEnv) {
      return absl::DataLossError(
          absl::StrCat(what, ": 'blas_env' is not a list of at most ", kMaxBlasEnv, " strings"));
    }
    for (const auto& e : j["blas_env"]) {
      if (!e.is_string()) {
        return absl::DataLossError(absl::StrCat(what, ": 'blas_env' holds a non-string"));
      }
      env.blas_env.push_back(e.get<std::string>());
    }
  }
  if (absl::Status s = ValidateNumericEnv(env, what); !s.ok()) {
    return absl::DataLossError(s.message());
  }
  return env;
}

absl::Status ValidateNumericEnv(const NumericEnv& env, const std::string& what) {
  std::vector<std::pair<std::string, const std::string*>> texts;
  for (const auto& [name, field] : TextFields()) texts.emplace_back(name, &(env.*field));
  if (env.blas_env.size() > kMaxBlasEnv) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": more than ", kMaxBlasEnv, " blas_env entries"));
  }
  for (const std::string& e : env.blas_env) texts.emplace_back("blas_env", &e);
  for (const auto& [name, value] : texts) {
    if (value->size() > kMaxFieldChars || !IsPrintableAscii(*value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", name, " must be at most ", kMaxFieldChars, " printable ASCII characters"));
    }
  }
  return absl::OkStatus();
}

void NumericEnvToProto(const NumericEnv& env, v1::NumericEnv* out) {
  out->set_torch(env.torch);
  out->set_torch_build(env.torch_build);
  out->set_blas(env.blas);
  out->set_blas_core(env.blas_core);
  out->set_gpu(env.gpu);
  out->set_blas_threads(static_cast<uint32_t>(std::max(0, env.blas_threads)));
  for (const std::string& e : env.blas_env) out->add_blas_env(e);
  out->set_cpu(env.cpu);
}

NumericEnv NumericEnvFromProto(const v1::NumericEnv& in, bool on_gpu) {
  NumericEnv env;
  env.torch = in.torch();
  env.torch_build = in.torch_build();
  env.blas = in.blas();
  env.blas_core = in.blas_core();
  env.gpu = in.gpu();
  env.device = ComputeDevice(in.gpu(), on_gpu);
  env.blas_threads = static_cast<int>(std::min<uint32_t>(in.blas_threads(), 1u << 20));
  env.blas_env.assign(in.blas_env().begin(), in.blas_env().end());
  env.cpu = in.cpu();
  return env;
}

std::string ComputeDevice(const std::string& gpu, bool on_gpu) {
  return on_gpu ? absl::StrCat("cuda ", gpu) : "cpu";
}

bool SameBlasKernel(const std::string& core, const std::string& kernel) {
  return !core.empty() && strcasecmp(core.c_str(), kernel.c_str()) == 0;
}

bool ValidBlasKernelName(const std::string& kernel) {
  return !kernel.empty() && kernel.size() <= 32 &&
         std::all_of(kernel.begin(), kernel.end(), [](char c) {
           return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_';
         });
}

bool IsPrintableAscii(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

bool PinBlasThreads(int threads) {
  using SetFn = void (*)(int);
  const auto set = OpenBlasSymbol<SetFn>("openblas_set_num_threads");
  if (set == nullptr) return false;
  set(std::max(1, threads));
  return true;
}

absl::Status PinBlasKernel(const std::string& kernel, char** argv) {
  if (kernel.empty()) return absl::OkStatus();
  if (!ValidBlasKernelName(kernel)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", kernel, "' is not an OpenBLAS kernel name (letters, digits, '_')"));
  }
  NumericEnv env;
  ProbeBlas(env);
  if (env.blas.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("train.blas_kernel is '", kernel,
                     "' but this process's BLAS is not OpenBLAS, whose kernels it names: install "
                     "libopenblas0-pthread (or unset train.blas_kernel)"));
  }
  if (SameBlasKernel(env.blas_core, kernel)) return absl::OkStatus();
  const char* given = std::getenv("OPENBLAS_CORETYPE");
  if (given != nullptr && SameBlasKernel(given, kernel)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "train.blas_kernel is '", kernel,
        "' and OpenBLAS was started with OPENBLAS_CORETYPE=", given, " but chose the kernel '",
        env.blas_core, "': it does not know that name, or this CPU cannot run that kernel"));
  }
  if (const char* pinned = std::getenv(kPinnedMarker); pinned != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("the job pins the OpenBLAS kernel '", kernel,
                                                      "' but this process started again once "
                                                      "already, for '",
                                                      pinned, "': it does not start again twice"));
  }
  LOG(INFO) << "OpenBLAS chose the kernel '" << env.blas_core << "' and the job pins '" << kernel
            << "' (train.blas_kernel): starting again with OPENBLAS_CORETYPE=" << kernel;
  google::FlushLogFiles(google::GLOG_INFO);
  setenv("OPENBLAS_CORETYPE", kernel.c_str(), 1);
  setenv(kPinnedMarker, kernel.c_str(), 1);
  execv("/proc/self/exe", argv);
  return absl::InternalError(absl::StrCat("cannot start again with OPENBLAS_CORETYPE=", kernel,
                                          ": exec /proc/self/exe: ", std::strerror(errno)));
}

}  // namespace flashdraft
