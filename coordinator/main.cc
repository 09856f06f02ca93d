// flashdraft-coordinator --job JOB.yaml [--set section.field=value ...] [--port-file FILE]
#include <CLI/CLI.hpp>
#include <csignal>
#include <fstream>
#include <iostream>
#include <thread>

#include "common/job_config.h"
#include "common/logging.h"
#include "coordinator/coordinator.h"
#include "coordinator/sources/target_source.h"

namespace {

int Fail(const absl::Status& s) {
  std::cerr << "flashdraft-coordinator: error: " << s.message() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  flashdraft::InitLogging(argv[0]);
  CLI::App app{"flashdraft coordinator: data, schedule, membership, rendezvous"};
  std::string job_path, port_file;
  std::vector<std::string> overrides;
  app.add_option("--job", job_path, "YAML job file")->required();
  app.add_option("--set", overrides, "override a field: section.field=value (repeatable)");
  app.add_option("--port-file", port_file, "write the bound port here once listening");
  CLI11_PARSE(app, argc, argv);

  // SIGINT/SIGTERM end the job cleanly: blocked here, before gRPC starts any thread (threads
  // inherit the mask), and turned into Abort() by a waiter thread below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<flashdraft::JobConfig> job = flashdraft::LoadJobConfig(job_path);
  if (!job.ok()) return Fail(job.status());
  for (const std::string& o : overrides) {
    absl::Status s = flashdraft::ApplyOverride(*job, o);
    if (!s.ok()) return Fail(s);
  }
  auto coordinator = flashdraft::Coordinator::Create(
      *job, [](const flashdraft::JobConfig& j) -> absl::StatusOr<flashdraft::SourceBundle> {
        if (j.data.source == "target") return flashdraft::OpenTargetSource(j);
        return flashdraft::Coordinator::OpenShardSource(j);
      });
  if (!coordinator.ok()) return Fail(coordinator.status());
  absl::Status started = (*coordinator)->Start();
  if (!started.ok()) return Fail(started);
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << (*coordinator)->port() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  std::cout << "listening on port " << (*coordinator)->port() << std::endl;

  flashdraft::Coordinator* c = coordinator->get();
  std::thread([signals, c]() mutable {
    int sig = 0;
    if (sigwait(&signals, &sig) == 0) {
      c->Abort(
          absl::CancelledError(sig == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)"));
    }
  }).detach();

  absl::Status result = c->Run();
  if (!result.ok()) return Fail(result);
  return 0;
}
