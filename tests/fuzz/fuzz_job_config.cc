// libFuzzer: job files. Whatever parses must print back to YAML that parses to the same job.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/job_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flashdraft;
  auto job = ParseJobConfig(std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
  if (!job.ok()) return 0;
  const std::string yaml = JobConfigToYaml(*job);
  auto again = ParseJobConfig(yaml, "round-trip");
  if (!again.ok() || JobConfigToYaml(*again) != yaml) std::abort();
  return 0;
}
