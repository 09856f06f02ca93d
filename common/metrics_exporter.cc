#include "common/metrics_exporter.h"

#include <CivetServer.h>
#include <civetweb.h>
#include <netdb.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/net_util.h"
#include "common/process_memory.h"
#include "glog/logging.h"

namespace flashdraft {
namespace {

// The HealthState each serving exporter answers for, by its listening port: civetweb's request
// callback is one function for the process, and a request says which port it came in on. A probe
// reads its state under this lock, so an exporter that unregisters (in its destructor, before its
// server stops) never has its state read after that.
struct ProbeRegistry {
  absl::Mutex mu;
  std::map<int, const HealthState*> by_port ABSL_GUARDED_BY(mu);
};

ProbeRegistry& Probes() {
  static ProbeRegistry* registry = new ProbeRegistry();
  return *registry;
}

// civetweb's begin_request: answers GET or HEAD /healthz and /readyz (text, 200 or 503) and leaves
// everything else (0) to prometheus-cpp's handlers. A port not registered yet is starting: 503.
int AnswerProbe(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  if (info == nullptr || info->local_uri == nullptr) return 0;
  const absl::string_view uri = info->local_uri;
  const bool healthz = uri == "/healthz";
  if (!healthz && uri != "/readyz") return 0;
  ProbeAnswer answer{503, "starting"};
  {
    ProbeRegistry& probes = Probes();
    absl::MutexLock lock(&probes.mu);
    auto it = probes.by_port.find(info->server_port);
    if (it != probes.by_port.end()) {
      answer = healthz ? it->second->Healthz() : it->second->Readyz();
    }
  }
  const std::string body = answer.body + "\n";
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            answer.status, answer.status == 200 ? "OK" : "Service Unavailable", body.size());
  if (info->request_method == nullptr || std::strcmp(info->request_method, "HEAD") != 0) {
    mg_write(conn, body.data(), body.size());
  }
  return answer.status;
}

const CivetCallbacks* ProbeCallbacks() {
  static const CivetCallbacks* callbacks = [] {
    auto* c = new CivetCallbacks();
    c->begin_request = AnswerProbe;
    return c;
  }();
  return callbacks;
}

// The standard process metrics (the names every Prometheus client library uses), read from
// /proc/self when scraped: resident and virtual memory, CPU time, start time, open descriptors,
// threads.
class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    std::ifstream stat_file("/proc/self/stat");
    std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
    // Fields after the command name (which is in parentheses and may hold spaces).
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) return out;
    const std::vector<std::string> f =
        absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
    // f[0] is field 3 (state): utime 14, stime 15, num_threads 20, starttime 22, vsize 23, rss 24.
    auto field = [&f](int number) -> double {
      const size_t i = static_cast<size_t>(number - 3);
      return i < f.size() ? std::strtod(f[i].c_str(), nullptr) : 0;
    };
    const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
    const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
    Add(out, "process_cpu_seconds_total", "User and system CPU time spent in seconds",
        prometheus::MetricType::Counter, (field(14) + field(15)) / ticks);
    Add(out, "process_resident_memory_bytes", "Resident memory size in bytes",
        prometheus::MetricType::Gauge, field(24) * page);
    Add(out, "flashdraft_process_peak_resident_memory_bytes",
        "The largest resident memory size the process has had, in bytes",
        prometheus::MetricType::Gauge, static_cast<double>(PeakResidentBytes()));
    Add(out, "process_virtual_memory_bytes", "Virtual memory size in bytes",
        prometheus::MetricType::Gauge, field(23));
    Add(out, "process_threads", "Threads of the process", prometheus::MetricType::Gauge, field(20));
    if (const double boot = BootTime(); boot > 0) {
      Add(out, "process_start_time_seconds", "Start time of the process since the Unix epoch",
          prometheus::MetricType::Gauge, boot + field(22) / ticks);
    }
    std::error_code ec;
    double fds = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      ++fds;
    }
    Add(out, "process_open_fds", "Open file descriptors", prometheus::MetricType::Gauge, fds);
    return out;
  }

 private:
  static void Add(std::vector<prometheus::MetricFamily>& out, const std::string& name,
                  const std::string& help, prometheus::MetricType type, double value) {
    prometheus::ClientMetric metric;
    if (type == prometheus::MetricType::Counter) {
      metric.counter.value = value;
    } else {
      metric.gauge.value = value;
    }
    out.push_back({name, help, type, {metric}});
  }

  static double BootTime() {
    std::ifstream in("/proc/stat");
    std::string key;
    double value = 0;
    while (in >> key) {
      if (key == "btime") {
        in >> value;
        return value;
      }
      in.ignore(1 << 20, '\n');
    }
    return 0;
  }
};

// Connects to the listener and hangs up at once (a wake-up, no request).
void Knock(const sockaddr_storage& address, socklen_t length) {
  const int fd = socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  (void)connect(fd, reinterpret_cast<const sockaddr*>(&address), length);
  close(fd);
}

}  // namespace

MetricsExporter::MetricsExporter(const prometheus::Labels& build_labels,
                                 const std::vector<std::pair<std::string, std::string>>& more)
    : registry_(std::make_shared<prometheus::Registry>()),
      process_(std::make_shared<ProcessCollector>()) {
  prometheus::Labels labels = build_labels;
  for (const auto& [name, value] : more) labels[name] = value;
  labels["version"] = FLASHDRAFT_VERSION;
  labels["commit"] = FLASHDRAFT_COMMIT;
  Gauge("flashdraft_build_info", "Always 1; the labels say which build runs", labels).Set(1);
}

// civetweb's listener looks at its stop flag only between polls of its socket, every 2 s: while
// the exposer stops, connections wake it, so that a process exits at once instead of up to 2 s
// later (long enough for launch's end-of-job SIGTERM to find it still there).
MetricsExporter::~MetricsExporter() {
  if (probe_port_ >= 0) {
    ProbeRegistry& probes = Probes();
    absl::MutexLock lock(&probes.mu);
    probes.by_port.erase(probe_port_);
  }
  if (exposer_ == nullptr || wake_length_ == 0) return;
  std::atomic<bool> stopped{false};
  std::thread waker([this, &stopped] {
    while (!stopped.load()) {
      Knock(wake_address_, wake_length_);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  exposer_.reset();
  stopped = true;
  waker.join();
}

prometheus::Gauge& MetricsExporter::Gauge(const std::string& name, const std::string& help,
                                          const prometheus::Labels& labels) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add(labels);
}

prometheus::Counter& MetricsExporter::Counter(const std::string& name, const std::string& help,
                                              const prometheus::Labels& labels) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add(labels);
}

prometheus::Histogram& MetricsExporter::Seconds(const std::string& name, const std::string& help,
                                                const prometheus::Labels& labels) {
  return prometheus::BuildHistogram()
      .Name(name)
      .Help(help)
      .Register(*registry_)
      .Add(labels,
           prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                   0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100});
}

absl::StatusOr<int> MetricsExporter::Serve(const std::string& listen, const std::string& field) {
  try {
    // Two threads, so that one client that connects and sends nothing (a port scan, a stuck
    // scraper) does not hold a scheduler's probes; civetweb gives it up after 10 s, not 30.
    exposer_ = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", listen, "num_threads", "2",
                                 "request_timeout_ms", "10000"},
        ProbeCallbacks());
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(field, " ", listen, ": cannot serve /metrics: ", e.what()));
  }
  exposer_->RegisterCollectable(registry_);
  exposer_->RegisterCollectable(process_);
  const std::vector<int> ports = exposer_->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError(absl::StrCat(field, " ", listen, ": no port"));
  SetWakeAddress(listen, ports.front());
  {
    ProbeRegistry& probes = Probes();
    absl::MutexLock lock(&probes.mu);
    if (probe_port_ >= 0) probes.by_port.erase(probe_port_);  // served again
    probe_port_ = -1;
    // Two exporters of one process on one port number (another address family): the first
    // answers the probes of both.
    if (probes.by_port.emplace(ports.front(), &health_).second) {
      probe_port_ = ports.front();
    } else {
      LOG(WARNING) << field << " " << listen << ": another /metrics of this process has port "
                   << ports.front() << "; /healthz and /readyz there answer for that one";
    }
  }
  return ports.front();
}

void MetricsExporter::SetWakeAddress(const std::string& listen, int port) {
  // A listener on every interface is reached on its family's loopback.
  const HostPort to = SplitHostPort(
      ScrapeAddress(listen, port, absl::StartsWith(listen, "[") ? "::1" : "127.0.0.1"));
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(to.host.c_str(), to.port.c_str(), &hints, &found) != 0) return;
  if (found != nullptr && found->ai_addrlen <= sizeof(wake_address_)) {
    std::memcpy(&wake_address_, found->ai_addr, found->ai_addrlen);
    wake_length_ = found->ai_addrlen;
  }
  freeaddrinfo(found);
}

std::string MetricsExporter::Text() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& f : process_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace flashdraft
