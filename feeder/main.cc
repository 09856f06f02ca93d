// flashdraft-feeder --coordinator HOST:PORT --target DIR [--id NAME] [--listen HOST:PORT]
//                   [--advertise HOST:PORT] [--port-file FILE] [--max-bytes N] [--threads N]
//                   [--tls-ca CA --tls-cert C --tls-key K] [--serve-tls-cert C --serve-tls-key K]
//                   [--metrics-listen HOST:PORT] [--metrics-port-file FILE]
//                   [--token-file F | --job JOB.yaml]
// A target replica that computes the hidden states the coordinator assigns it and serves them to
// the workers (docs/ARCHITECTURE.md, "Feeders").
#include <glog/logging.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string>

#include "common/job_config.h"
#include "common/logging.h"
#include "common/numeric_env.h"
#include "common/security_flags.h"
#include "feeder/feeder.h"
#include "feeder/feeder_fault.h"

namespace {

struct Flags {
  flashdraft::FeederOptions options;
  std::string job_path;
};

void AddFlags(CLI::App& app, Flags& f) {
  flashdraft::FeederOptions& o = f.options;
  app.add_option("--coordinator", o.coordinator, "coordinator address host:port")->required();
  app.add_option("--target", o.target_path,
                 "the job's target folder on this host (default: target.path of --job)");
  app.add_option("--id", o.feeder_id, "feeder name (default host:pid)");
  app.add_option("--listen", o.listen, "serve FetchShard here (host:port; port 0 picks one)")
      ->capture_default_str();
  app.add_option("--advertise", o.advertise,
                 "host:port (or host, with the bound port) workers reach the service by "
                 "(default: this host's address toward the coordinator and the bound port)");
  app.add_option("--port-file", o.port_file, "write the bound FetchShard port here");
  app.add_option("--max-bytes", o.max_bytes, "computed features held at most (bytes)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1} << 20, uint64_t{1} << 50));
  app.add_option("--threads", o.threads, "compute threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--connect-timeout", o.connect_timeout_seconds,
                 "seconds to wait for the coordinator")
      ->capture_default_str();
  app.add_option("--serve-tls-cert", o.serve_tls_cert,
                 "the FetchShard service's certificate (PEM), for a TLS job");
  app.add_option("--serve-tls-key", o.serve_tls_key, "its private key (PEM)");
  app.add_option("--metrics-listen", o.metrics_listen,
                 "serve /metrics here (host:port; default: the job's metrics.worker_listen; off: "
                 "none)");
  app.add_option("--metrics-port-file", o.metrics_port_file, "write the bound /metrics port here");
  flashdraft::AddClientSecurityFlags(app, o.security, f.job_path);
}

int Run(Flags& f, char** argv) {
  flashdraft::FeederOptions& o = f.options;
  absl::StatusOr<flashdraft::ClientSecurity> security =
      flashdraft::ClientSecurityFromJob(f.job_path, o.security);
  if (!security.ok()) {
    std::cerr << "flashdraft-feeder: error: " << security.status().message() << "\n";
    return 2;
  }
  o.security = *security;
  if (!f.job_path.empty()) {
    absl::StatusOr<flashdraft::JobConfig> job = flashdraft::LoadJobConfig(f.job_path);
    if (!job.ok()) {
      std::cerr << "flashdraft-feeder: error: " << job.status().message() << "\n";
      return 2;
    }
    if (o.target_path.empty()) o.target_path = job->target.path;
    // The job's OpenBLAS kernel (train.blas_kernel), as the coordinator runs with it: otherwise
    // the features differ in their last bits and the coordinator refuses this feeder.
    if (absl::Status s = flashdraft::PinBlasKernel(job->train.blas_kernel, argv); !s.ok()) {
      std::cerr << "flashdraft-feeder: error: " << s.message() << "\n";
      return 2;
    }
  }
  if (o.target_path.empty()) {
    std::cerr << "flashdraft-feeder: error: --target (or --job with target.path) is required\n";
    return 2;
  }
  absl::StatusOr<int> slow = flashdraft::ParseFeederFault(std::getenv("FLASHDRAFT_FAULT"));
  if (!slow.ok()) {
    std::cerr << "flashdraft-feeder: error: " << slow.status().message() << "\n";
    return 2;
  }
  o.slow_ms_per_sample = *slow;
  const absl::Status s = flashdraft::RunFeeder(o);
  if (!s.ok()) {
    std::cerr << "flashdraft-feeder: error: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  flashdraft::InitLogging(argv[0]);
  // SIGTERM ends the process at once: a feeder holds nothing that outlives it (its work goes to
  // the other feeders).
  std::signal(SIGTERM, [](int) { _exit(0); });
  CLI::App app{"flashdraft feeder: computes the target's hidden states for the workers"};
  Flags flags;
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  return Run(flags, argv);
}
