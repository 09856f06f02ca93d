// What every flashdraft process that serves Prometheus metrics shares (docs/OBSERVABILITY.md): one
// registry, the families built the same way (prefix flashdraft_, base units, counters end in
// _total, no unbounded labels), flashdraft_build_info, the standard process_* metrics read from
// /proc at scrape time, and prometheus-cpp's Exposer serving /metrics on a "host:port" (port 0
// picks one) with /healthz and /readyz beside it. The coordinator's CoordinatorMetrics, the
// worker's WorkerMetrics and the feeder's FeederMetrics are built on it.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <sys/socket.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/health.h"

namespace flashdraft {

class MetricsExporter {
 public:
  // `build_labels`: flashdraft_build_info's labels besides version and commit (role, backend...);
  // `more`: further ones (the process's NumericEnvLabels).
  explicit MetricsExporter(const prometheus::Labels& build_labels,
                           const std::vector<std::pair<std::string, std::string>>& more = {});
  ~MetricsExporter();

  // One labelled series of a family; the registry merges calls with the same name.
  prometheus::Gauge& Gauge(const std::string& name, const std::string& help,
                           const prometheus::Labels& labels = {});
  prometheus::Counter& Counter(const std::string& name, const std::string& help,
                               const prometheus::Labels& labels = {});
  // Buckets in seconds, from 1 ms to 100 s.
  prometheus::Histogram& Seconds(const std::string& name, const std::string& help,
                                 const prometheus::Labels& labels = {});

  // Serves /metrics on `listen`, and /healthz and /readyz as health() answers them; `field` names
  // the setting in errors (e.g. "metrics.listen"). Returns the bound port.
  absl::StatusOr<int> Serve(const std::string& listen, const std::string& field);

  // What /healthz and /readyz answer (common/health.h): the process reports to it.
  HealthState& health() { return health_; }

  // The exposition text of everything, as a scrape returns it.
  std::string Text() const;

 private:
  // Where the destructor knocks to wake the listener (see there).
  void SetWakeAddress(const std::string& listen, int port);

  HealthState health_;
  int probe_port_ = -1;  // where health_ answers (registered by port, see metrics_exporter.cc)
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> process_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  sockaddr_storage wake_address_{};
  socklen_t wake_length_ = 0;
};

}  // namespace flashdraft
