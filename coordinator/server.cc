#include "coordinator/server.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/grpc_options.h"
#include "common/net_util.h"
#include "coordinator/scrape_targets.h"
#include "glog/logging.h"

namespace flashdraft {

absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const JobConfig& job, ServerSecurity& security, const std::vector<grpc::Service*>& services,
    int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(job.cluster.listen, security.credentials(), port);
  ConfigureServer(builder);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || *port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", job.cluster.listen));
  }
  const bool loopback = IsLoopbackListen(job.cluster.listen);
  LOG(INFO) << "gRPC on " << job.cluster.listen << ", port " << *port
            << (loopback ? " (this host only)" : "") << "; security: " << security.description();
  if (!loopback && job.security.insecure &&
      (job.security.tls_cert.empty() || job.security.token_file.empty())) {
    LOG(WARNING) << "INSECURE (security.insecure: true): anyone who reaches port " << *port
                 << " can join the job, read the target's and the drafter's weights and feed it "
                    "data";
  }
  return server;
}

absl::StatusOr<std::string> StartMetricsListener(const JobConfig& job,
                                                 CoordinatorMetrics& metrics) {
  absl::StatusOr<int> port = metrics.Serve(job.metrics.listen);
  if (!port.ok()) return port.status();
  if (absl::Status s =
          WriteFileAtomically(job.output_dir + "/metrics.port", absl::StrCat(*port, "\n"));
      !s.ok()) {
    return s;
  }
  // Prometheus's file_sd view of the job; workers are added as they tell where they serve.
  std::error_code ec;
  std::filesystem::create_directories(job.output_dir + "/prometheus", ec);
  LOG(INFO) << "metrics on port " << *port << " (/metrics"
            << (IsLoopbackListen(job.metrics.listen)
                    ? ", this host only)"
                    : ", plain HTTP without authentication: keep it on a private network)");
  return ScrapeAddress(job.metrics.listen, *port);
}

}  // namespace flashdraft
