// The Prometheus file_sd target file of a job (<output_dir>/prometheus/targets.json): every
// process of the job that serves /metrics, one target group each, labelled with the job's name and
// the process's role. The coordinator rewrites it (atomically) when that set changes; a Prometheus
// `file_sd_configs` entry pointed at it follows the job (docs/OBSERVABILITY.md).
#pragma once

#include <string>
#include <vector>

namespace flashdraft {

struct ScrapeTarget {
  std::string address;  // host:port Prometheus scrapes
  std::string role;     // "coordinator" | "worker" | "feeder"
  std::string id;       // a worker's or feeder's id: the label named after its role
};

// The file's JSON text.
std::string ScrapeTargetsJson(const std::string& job_name,
                              const std::vector<ScrapeTarget>& targets);

}  // namespace flashdraft
