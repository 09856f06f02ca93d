#include "worker/worker.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/call_retry.h"
#include "common/clock.h"
#include "common/cuda_util.h"
#include "common/file_util.h"
#include "common/job_config.h"
#include "common/net_util.h"
#include "common/numeric_env.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "flashdraft/v1/coordinator.grpc.pb.h"
#include "glog/logging.h"
#include "model/numeric_probe.h"
#include "worker/collective/collective_factory.h"
#include "worker/coordinator_link.h"
#include "worker/fault.h"
#include "worker/feeder_client.h"
#include "worker/grpc_store.h"
#include "worker/training_state.h"
#include "worker/worker_metrics.h"
#include "worker/worker_session.h"

namespace flashdraft {
namespace {

double Now() { return RealClock::Get().Now(); }

// Whether main's SIGTERM asked this worker to leave the job.
bool Leaving(const WorkerOptions& o) { return o.leave != nullptr && o.leave->requested(); }

// Sleeps up to `seconds`, waking early when asked to leave.
void SleepUnlessLeaving(const WorkerOptions& o, double seconds) {
  const double until = Now() + seconds;
  while (!Leaving(o) && Now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// The process's /metrics: started at the first Join (the job says where), kept across sessions.
struct MetricsEndpoint {
  std::unique_ptr<WorkerMetrics> metrics;
  std::string address;  // where Prometheus reaches it
  bool decided = false;
};

absl::Status StartMetrics(const WorkerOptions& o, const JobConfig& job, const NumericEnv& numerics,
                          MetricsEndpoint& m) {
  if (m.decided) return absl::OkStatus();
  m.decided = true;
  const bool from_flag = !o.metrics_listen.empty();
  const std::string listen = from_flag ? o.metrics_listen : job.metrics.worker_listen;
  const std::string field = from_flag ? "--metrics-listen" : "metrics.worker_listen";
  if (!job.metrics.enabled || listen.empty() || listen == "off") return absl::OkStatus();
  auto metrics = std::make_unique<WorkerMetrics>(job.worker.device, job.cluster.backend,
                                                 NumericEnvLabels(numerics));
  absl::StatusOr<int> port = metrics->Serve(listen, field);
  if (!port.ok()) return absl::FailedPreconditionError(port.status().message());
  absl::StatusOr<std::string> toward = LocalAddressToward(o.coordinator);
  m.address = ScrapeAddress(listen, *port, toward.ok() ? *toward : "");
  if (!o.metrics_port_file.empty()) {
    FD_RETURN_IF_ERROR(WriteFileAtomically(o.metrics_port_file, absl::StrCat(*port, "\n")));
  }
  LOG(INFO) << "metrics on " << m.address << " (/metrics)";
  if (IsLoopbackListen(listen) && !IsLoopbackListen(o.coordinator)) {
    LOG(WARNING) << field << " " << listen
                 << " is this host only, but the coordinator is elsewhere: Prometheus cannot "
                    "scrape this worker from another host (0.0.0.0:0 serves on every interface)";
  }
  m.metrics = std::move(metrics);
  return absl::OkStatus();
}

// cuda:<local rank>: with one visible GPU (CUDA_VISIBLE_DEVICES set per worker by launch, Slurm's
// --gpus-per-task, a container's device) that one; with several, the local rank's
// (LOCAL_RANK or SLURM_LOCALID) among them. Counted by the CUDA runtime, not LibTorch: NCCL's
// staging uses a GPU under a CPU-only LibTorch too.
int LocalCudaDevice() {
  const int count = CudaDeviceCount();
  if (count <= 1) return 0;
  for (const char* name : {"LOCAL_RANK", "SLURM_LOCALID"}) {
    int rank = 0;
    const char* v = std::getenv(name);
    if (v != nullptr && absl::SimpleAtoi(v, &rank) && rank >= 0) return rank % count;
  }
  return 0;
}

// This process's numeric environment; the GPU named is the one it would train on.
NumericEnv WorkerNumerics(const WorkerOptions& o) {
  const std::string gpu =
      CudaDeviceUsable().ok()
          ? CudaDeviceName(o.cuda_device >= 0 ? o.cuda_device : LocalCudaDevice())
          : "";
  return ProbeNumericEnv(gpu);
}

v1::JoinRequest MakeJoinRequest(const WorkerOptions& o, const NumericEnv& numerics) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  v1::JoinRequest join;
  join.set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
  join.set_worker_id(o.worker_id.empty() ? absl::StrCat(host, ":", getpid()) : o.worker_id);
  v1::Capability& c = *join.mutable_capability();
  c.set_hostname(host);
  c.set_device(torch::cuda::is_available() ? absl::StrCat("cuda x", torch::cuda::device_count())
                                           : "cpu");
  c.set_backend(BuiltCollectiveBackends());
  if (absl::StatusOr<CudaMemory> m = CudaMemoryInfo(0); m.ok()) {
    c.set_device_memory_bytes(static_cast<uint64_t>(m->total_bytes));
  }
  NumericEnvToProto(numerics, c.mutable_numerics());
  return join;
}

// Join: admission and the job; the rank comes with the first epoch's Reform. Short attempts up to
// connect_timeout_seconds, so that a SIGTERM meanwhile is seen. nullopt: asked to leave first.
absl::StatusOr<std::optional<v1::JoinReply>> Join(v1::Coordinator::Stub& stub,
                                                  const v1::JoinRequest& join,
                                                  const WorkerOptions& o, double timeout) {
  v1::JoinReply reply;
  const std::optional<grpc::Status> s = CallUntilReachable(
      RealClock::Get(), timeout,
      [&](grpc::ClientContext& ctx) { return stub.Join(&ctx, join, &reply); },
      [&] { return Leaving(o); });
  if (!s.has_value()) return std::nullopt;
  if (s->ok()) return reply;
  if (s->error_code() == grpc::StatusCode::UNAUTHENTICATED) {  // fatal: joining again won't help
    return absl::UnauthenticatedError(absl::StrCat("the coordinator at ", o.coordinator, " ",
                                                   s->error_message(), " (--token-file)"));
  }
  return absl::UnavailableError(
      absl::StrCat("cannot join the coordinator at ", o.coordinator, ": ", s->error_message()));
}

// A refusal as an error. Another OpenBLAS kernel than the job pins: start again with it (once; it
// does not return).
absl::Status CheckAdmitted(const v1::JoinReply& reply, const WorkerOptions& o) {
  if (reply.accepted()) return absl::OkStatus();
  const absl::Status pinned = !reply.blas_kernel().empty() && o.pin_blas_kernel
                                  ? o.pin_blas_kernel(reply.blas_kernel())
                                  : absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("refused by the coordinator: ", reply.reason(),
                                                    pinned.ok() ? "" : "; ", pinned.message()));
}

// The job the coordinator admitted this worker to, into `setup`; the process set up for it
// (metrics, intra-op threads).
absl::Status AcceptJob(const WorkerOptions& o, const v1::JoinRequest& join,
                       const v1::JoinReply& reply, const NumericEnv& numerics,
                       MetricsEndpoint& endpoint, SessionSetup& setup) {
  FD_ASSIGN_OR_RETURN(setup.job, ParseJobConfig(reply.job_config_yaml(), "the coordinator's job"));
  FD_ASSIGN_OR_RETURN(setup.drafter_config, ParseDrafterConfig(reply.drafter_config_json(),
                                                               "the coordinator's drafter config"));
  const JobConfig& job = setup.job;
  FD_RETURN_IF_ERROR(StartMetrics(o, job, numerics, endpoint));
  if (endpoint.metrics) endpoint.metrics->Joined();
  // One thread count for the whole job (train.intra_op_threads): some reductions split by it.
  PinComputeThreads(job.train.intra_op_threads);
  LOG(INFO) << "joined as '" << join.worker_id() << "' with " << job.train.intra_op_threads
            << " intra-op thread(s), precision " << job.train.precision << ", on "
            << job.worker.device;
  setup.worker_id = join.worker_id();
  setup.session_token = reply.session_token();
  setup.metrics_address = endpoint.address;
  return absl::OkStatus();
}

// Where the job's collective runs: on cluster.collective_interface, else on the address that
// reaches the coordinator; on the GPU of --cuda-device, else the local rank's.
absl::Status PlaceCollective(const WorkerOptions& o, SessionSetup& setup) {
  if (setup.job.cluster.collective_interface.empty()) {
    FD_ASSIGN_OR_RETURN(setup.collective_address, LocalAddressToward(o.coordinator));
    LOG(INFO) << "collective traffic on " << setup.collective_address
              << " (the address that reaches the coordinator; cluster.collective_interface "
                 "names another)";
  }
  setup.cuda_device = o.cuda_device >= 0 ? o.cuda_device : LocalCudaDevice();
  return absl::OkStatus();
}

struct SessionEnd {
  bool joined = false;        // the coordinator admitted this worker
  bool job_finished = false;  // its Shutdown said the job trained all its steps
};

// One session with one coordinator process: join, fetch, train until the job ends. UNAVAILABLE
// when the coordinator could not be reached within `join_timeout` or went away (RunWorker joins
// again); `end` says whether the coordinator admitted this worker and whether the job finished.
absl::Status RunSession(const WorkerOptions& o, const NumericEnv& numerics,
                        MetricsEndpoint& endpoint, double join_timeout, SessionEnd& end) {
  FD_ASSIGN_OR_RETURN(const FaultPlan fault, ParseFault(std::getenv("FLASHDRAFT_FAULT")));
  FD_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                      CreateSecureChannel(o.coordinator, o.security));
  std::shared_ptr<v1::Coordinator::Stub> stub = v1::Coordinator::NewStub(channel);
  const v1::JoinRequest join = MakeJoinRequest(o, numerics);
  FD_ASSIGN_OR_RETURN(const std::optional<v1::JoinReply> reply, Join(*stub, join, o, join_timeout));
  if (!reply) {
    LOG(INFO) << "asked to leave before joining";
    return absl::OkStatus();
  }
  FD_RETURN_IF_ERROR(CheckAdmitted(*reply, o));
  end.joined = true;
  SessionSetup setup;
  FD_RETURN_IF_ERROR(AcceptJob(o, join, *reply, numerics, endpoint, setup));
  setup.fault = fault;
  // The frozen target tensors and the starting weights, both from the coordinator.
  FD_ASSIGN_OR_RETURN(setup.fetched,
                      FetchTensors(channel, setup.session_token, o.fetch_timeout_seconds));
  setup.store = c10::make_intrusive<GrpcStore>(
      stub, setup.session_token,
      std::chrono::milliseconds(
          static_cast<int64_t>(setup.job.cluster.collective_timeout_seconds * 1000)));
  FD_RETURN_IF_ERROR(PlaceCollective(o, setup));
  if (o.configure_process) o.configure_process(setup.job);  // before any group forms
  SessionHooks hooks;
  hooks.leave = o.leave;
  hooks.metrics = endpoint.metrics.get();
  // A shard's features may come from a target feeder: fetched with this worker's credentials,
  // as patiently as a collective.
  FeederClient feeders(o.security, setup.job.cluster.collective_timeout_seconds);
  hooks.shard_fetcher = &feeders;
  FD_ASSIGN_OR_RETURN(auto session, WorkerSession::Create(std::move(setup), hooks));
  GrpcCoordinatorLink link(channel);
  const absl::Status s = session->Run(link);
  end.job_finished = s.ok() && session->job_finished();
  return s;
}

}  // namespace

std::string ProbeWorker() {
  std::string out = absl::StrCat("backends: ", BuiltCollectiveBackends(), "\n",
                                 "torch_cuda: ", torch::cuda::is_available() ? "yes" : "no", "\n");
  const absl::Status usable = CudaDeviceUsable();
  absl::StrAppend(&out, "cuda_devices: ", usable.ok() ? CudaDeviceCount() : 0, "\n");
  if (!usable.ok()) absl::StrAppend(&out, "cuda: ", usable.message(), "\n");
  absl::StrAppend(&out, NumericEnvProbeLines(WorkerNumerics(WorkerOptions())));
  return out;
}

absl::StatusOr<WorkerEnd> RunWorker(const WorkerOptions& o) {
  // The first join waits connect_timeout_seconds for the coordinator. One that goes away later
  // (crashed, restarted with --resume, or this worker was dropped as hung) is joined again, with
  // back-off, until reconnect_timeout_seconds pass without a session (each join within what is
  // left of them); the new session starts from what the coordinator serves (its checkpoint).
  double backoff = 0.5;
  std::optional<double> lost_at;  // since when it has been without a session, once it had one
  MetricsEndpoint metrics;
  const NumericEnv numerics = WorkerNumerics(o);
  LOG(INFO) << "numerics: " << DescribeNumericEnv(numerics);
  while (true) {
    const double join_timeout =
        lost_at ? std::min(o.connect_timeout_seconds,
                           std::max(0.0, *lost_at + o.reconnect_timeout_seconds - Now()))
                : o.connect_timeout_seconds;
    SessionEnd end;
    absl::Status s = RunSession(o, numerics, metrics, join_timeout, end);
    if (s.ok() && end.job_finished) return WorkerEnd::kJobFinished;
    if (Leaving(o) && (s.ok() || absl::IsUnavailable(s))) {
      LOG(INFO) << "left the job (SIGTERM)";
      return WorkerEnd::kLeft;
    }
    if (s.ok()) return end.joined ? WorkerEnd::kJobStopped : WorkerEnd::kLeft;
    if (!absl::IsUnavailable(s)) return s;
    if (metrics.metrics) metrics.metrics->Rejoining(std::string(s.message()));
    if (end.joined) {  // it was in the job: a fresh loss
      lost_at = Now();
      backoff = 0.5;
    }
    if (!lost_at) return s;  // the first join found no coordinator in connect_timeout_seconds
    const double waited = Now() - *lost_at;
    if (waited + backoff > o.reconnect_timeout_seconds) return s;
    LOG(WARNING) << s.message() << "; joining again in " << backoff << " s (for up to "
                 << o.reconnect_timeout_seconds - waited << " s more)";
    SleepUnlessLeaving(o, backoff);
    backoff = std::min(backoff * 2, 8.0);
  }
}

}  // namespace flashdraft
