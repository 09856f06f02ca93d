// The coordinator's listeners: the gRPC server and the /metrics endpoint, with the port files
// and warnings a user of a shared cluster needs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_config.h"
#include "common/security.h"
#include "coordinator/metrics.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace flashdraft {

// Serves `services` on job.cluster.listen with the job's credentials; `port` is the bound port.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const JobConfig& job, ServerSecurity& security, const std::vector<grpc::Service*>& services,
    int* port);

// Serves `metrics` at /metrics on job.metrics.listen, writes the port to <output_dir>/metrics.port
// and makes <output_dir>/prometheus/; returns the address Prometheus scrapes.
absl::StatusOr<std::string> StartMetricsListener(const JobConfig& job, CoordinatorMetrics& metrics);

}  // namespace flashdraft
