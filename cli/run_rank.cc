#include "cli/run_rank.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cli/launch.h"
#include "cli/launch_console.h"
#include "cli/posix_process_launcher.h"
#include "cli/stop_signal.h"
#include "cli/supervisor.h"
#include "cli/torchrun_env.h"
#include "common/clock.h"
#include "common/job_config.h"
#include "common/net_util.h"
#include "common/status_macros.h"

namespace flashdraft {
namespace {

int Fail(const absl::Status& status) {
  std::cerr << "flashdraft run-rank: error: " << status.message() << "\n";
  return 1;
}

// The job as this attempt runs it: the file with --set and --out, up to WORLD_SIZE workers (down
// to its min_workers), from its newest checkpoint when there is one. Always: torchrun restarts a
// group without counting the restart when nodes join or leave (an elastic rendezvous), so the
// restart count cannot say whether an attempt is the first; a checkpoint of another job is still
// refused by its fingerprint.
absl::StatusOr<JobConfig> RankJob(const RunRankOptions& o, const TorchrunEnv& env) {
  FD_ASSIGN_OR_RETURN(JobConfig job, LoadJobConfig(o.job_path));
  FD_RETURN_IF_ERROR(ApplyOverrides(job, o.overrides));
  if (!o.out_dir.empty()) job.output_dir = o.out_dir;
  job.cluster.max_workers = env.world_size;
  job.cluster.min_workers = std::min(job.cluster.min_workers, env.world_size);
  job.checkpoint.resume = true;
  FD_RETURN_IF_ERROR(ValidateJobConfig(
      job, absl::StrCat(o.job_path, " under torchrun (WORLD_SIZE ", env.world_size, ")")));
  if (env.MultiNode() && IsLoopbackListen(job.cluster.listen)) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.job_path, ": cluster.listen ", job.cluster.listen,
                     " takes connections from this host only, but the ", env.world_size,
                     " ranks span several nodes (LOCAL_WORLD_SIZE ", env.local_world_size,
                     "): listen on 0.0.0.0:0, with TLS and a job secret (docs/SECURITY.md)"));
  }
  return job;
}

// torchrun's rendezvous store: its agent serves it under the static rendezvous
// (TORCHELASTIC_USE_AGENT_STORE=True), where every restart counts up; otherwise rank 0 serves it,
// as PyTorch's env:// does, and a store of an earlier round died with that round's rank 0. Either
// way no rank reads an address left by an attempt before its own.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> OpenStore(const TorchrunEnv& env,
                                                          double timeout_seconds) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = !env.agent_store && env.rank == 0;
  options.waitWorkers = false;
  options.multiTenant = true;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  try {
    return c10::intrusive_ptr<c10d::Store>(
        c10::make_intrusive<c10d::TCPStore>(env.master_addr, options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("the rendezvous store at ", env.master_addr, ":",
                                               env.master_port, ": ", e.what()));
  }
}

// Rank 0: the coordinator, its address in the store, then this rank's worker, supervised until
// the job ends.
int RunRankZero(const JobConfig& job, const TorchrunEnv& env, c10d::Store& store,
                const std::vector<std::string>& security, int stopped_exit_code) {
  absl::StatusOr<std::string> job_file = PrepareOutputDir(job);
  if (!job_file.ok()) return Fail(job_file.status());
  absl::StatusOr<Binaries> binaries = FindBinaries(job);
  if (!binaries.ok()) return Fail(binaries.status());
  TerminationSignals::Install();
  TerminationSignals signals;
  PosixProcessLauncher launcher;
  TerminalConsole console(job.output_dir + "/logs");
  SupervisorOptions options;
  options.restart.max_restarts = 0;  // torchrun restarts the whole attempt (--max_restarts)
  Supervisor supervisor(launcher, RealClock::Get(), signals, console, options);
  const std::string port_file = job.output_dir + "/coordinator.port";
  std::error_code ec;
  std::filesystem::remove(port_file, ec);
  if (!supervisor
           .StartCoordinator({binaries->coordinator, "--job", *job_file, "--port-file", port_file,
                              "--stopped-exit-code", absl::StrCat(stopped_exit_code)})
           .ok()) {
    return Fail(absl::InternalError("cannot start the coordinator"));
  }
  absl::StatusOr<int> port = supervisor.WaitForCoordinator([&] { return ReadPort(port_file); });
  if (absl::IsCancelled(port.status()) && stopped_exit_code != 0) {
    std::cerr << "[run-rank   ] " << port.status().message() << "\n";
    return stopped_exit_code;  // a SIGTERM: not an error of the job
  }
  if (!port.ok()) return Fail(port.status());
  const std::string address = ScrapeAddress(job.cluster.listen, *port, env.master_addr);
  try {
    store.set(CoordinatorKey(env), std::vector<uint8_t>(address.begin(), address.end()));
  } catch (const std::exception& e) {
    supervisor.SignalAll(SIGTERM);
    supervisor.Run();
    return Fail(
        absl::UnavailableError(absl::StrCat("cannot announce the coordinator: ", e.what())));
  }
  console.Note(absl::StrCat("rank 0 of ", env.world_size, " (attempt ", env.restart_count,
                            "): the coordinator listens on ", address));
  if (!supervisor
           .StartWorker("worker-0", WorkerArgv(job, binaries->worker, address, env.rank,
                                               env.local_rank, security))
           .ok()) {
    supervisor.SignalAll(SIGTERM);
    supervisor.Run();
    return Fail(absl::InternalError("cannot start the worker"));
  }
  const JobOutcome outcome = supervisor.Run();
  if (stopped_exit_code != 0 && outcome.coordinator_exit_code == stopped_exit_code) {
    return stopped_exit_code;
  }
  return outcome.ExitCode();
}

// Any other rank: the coordinator's address of this attempt from the store, then this process
// becomes the rank's worker (torchrun watches and signals it directly).
int RunOtherRank(const JobConfig& job, const TorchrunEnv& env,
                 c10::intrusive_ptr<c10d::Store> store, const std::vector<std::string>& security) {
  absl::StatusOr<Binaries> binaries = FindBinaries(job);
  if (!binaries.ok()) return Fail(binaries.status());
  std::string address;
  try {
    store->wait({CoordinatorKey(env)});
    const std::vector<uint8_t> value = store->get(CoordinatorKey(env));
    address.assign(value.begin(), value.end());
  } catch (const std::exception& e) {
    return Fail(absl::DeadlineExceededError(absl::StrCat("rank ", env.rank,
                                                         ": rank 0 announced no coordinator within "
                                                         "cluster.join_timeout_seconds (",
                                                         job.cluster.join_timeout_seconds,
                                                         " s): ", e.what())));
  }
  const std::vector<std::string> argv =
      WorkerArgv(job, binaries->worker, address, env.rank, env.local_rank, security);
  std::cout << "[run-rank   ] rank " << env.rank << " of " << env.world_size << " (attempt "
            << env.restart_count << "): worker joining " << address << std::endl;
  store.reset();  // the worker does not inherit the store's connection
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  return Fail(
      absl::InternalError(absl::StrCat("cannot run ", argv[0], ": ", std::strerror(errno))));
}

}  // namespace

int RunRank(const RunRankOptions& o) {
  absl::StatusOr<TorchrunEnv> env = ReadTorchrunEnv([](const char* name) { return getenv(name); });
  if (!env.ok()) return Fail(env.status());
  absl::StatusOr<JobConfig> job = RankJob(o, *env);
  if (!job.ok()) return Fail(job.status());
  absl::StatusOr<std::vector<std::string>> security = WorkerSecurityArgs(*job, o.job_path);
  if (!security.ok()) return Fail(security.status());
  if (o.stopped_exit_code != 0) {  // the worker's own flag, passed on with its others
    security->insert(security->end(), {"--stopped-exit-code", absl::StrCat(o.stopped_exit_code)});
  }
  if (absl::Status s = PinChildrenBlasKernel(job->train.blas_kernel); !s.ok()) return Fail(s);
  absl::StatusOr<c10::intrusive_ptr<c10d::Store>> store =
      OpenStore(*env, job->cluster.join_timeout_seconds);
  if (!store.ok()) return Fail(store.status());
  return env->rank == 0 ? RunRankZero(*job, *env, **store, *security, o.stopped_exit_code)
                        : RunOtherRank(*job, *env, std::move(*store), *security);
}

}  // namespace flashdraft
