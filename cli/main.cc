// flashdraft — the command-line tool. Subcommands that exist today:
//   flashdraft config check JOB.yaml [--set section.field=value ...]   validate a job file, print
//   it flashdraft inspect PATH                                            list a safetensors
//   file/model flashdraft version
// (launch, debug, prepare, eval and export arrive with their issues.)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/safetensors.h"

namespace flashdraft {
namespace {

int Fail(const absl::Status& status) {
  std::cerr << "flashdraft: error: " << status.message() << "\n";
  return 1;
}

int ConfigCheck(const std::string& path, const std::vector<std::string>& overrides) {
  absl::StatusOr<JobConfig> config = LoadJobConfig(path);
  if (!config.ok()) return Fail(config.status());
  for (const std::string& o : overrides) {
    absl::Status s = ApplyOverride(*config, o);
    if (!s.ok()) return Fail(s);
  }
  std::cout << "# " << path << ": valid\n" << JobConfigToYaml(*config);
  return 0;
}

int Inspect(const std::string& path) {
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> model = SafetensorsModel::Open(path);
  if (!model.ok()) return Fail(model.status());
  uint64_t total = 0;
  std::printf("%-60s %-5s %-22s %14s %10s\n", "tensor", "dtype", "shape", "bytes", "crc32c");
  for (const std::string& name : (*model)->names()) {
    TensorView v = *(*model)->Get(name);
    std::printf("%-60s %-5s %-22s %14zu   %08x\n", name.c_str(),
                std::string(DTypeName(v.dtype)).c_str(), ShapeString(v.shape).c_str(), v.nbytes,
                Crc32c(v.data, v.nbytes));
    total += v.nbytes;
  }
  std::printf("%zu tensors, %llu bytes\n", (*model)->names().size(),
              static_cast<unsigned long long>(total));
  return 0;
}

}  // namespace
}  // namespace flashdraft

int main(int argc, char** argv) {
  flashdraft::InitLogging(argv[0]);
  CLI::App app{"flashdraft: distributed training of DFlash speculative-decoding drafters"};
  app.require_subcommand(1);

  CLI::App* config = app.add_subcommand("config", "Job file tools");
  config->require_subcommand(1);
  CLI::App* check = config->add_subcommand("check", "Validate a job file and print it in full");
  std::string job_path;
  std::vector<std::string> overrides;
  check->add_option("job", job_path, "YAML job file")->required();
  check->add_option("--set", overrides, "Override a field: section.field=value (repeatable)");

  CLI::App* inspect = app.add_subcommand(
      "inspect", "List the tensors of a safetensors file or Hugging Face model folder");
  std::string inspect_path;
  inspect->add_option("path", inspect_path, "file.safetensors or model folder")->required();

  app.add_subcommand("version", "Print the version");

  CLI11_PARSE(app, argc, argv);
  if (check->parsed()) return flashdraft::ConfigCheck(job_path, overrides);
  if (inspect->parsed()) return flashdraft::Inspect(inspect_path);
  if (app.got_subcommand("version")) {
    std::printf("flashdraft %s\n", FLASHDRAFT_VERSION);
    return 0;
  }
  return 1;
}
