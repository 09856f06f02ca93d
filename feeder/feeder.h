// The feeder process (docs/ARCHITECTURE.md, "Feeders"): serves FetchShard, joins the coordinator
// with its target's fingerprint, tokenizer and numeric environment, opens the target, then
// regenerates the data lines (data.regenerate) and computes the shards its Feed stream assigns
// until the coordinator shuts it down or goes away.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/security.h"
#include "model/memory_estimate.h"

namespace flashdraft {

struct FeederOptions {
  std::string coordinator;  // host:port
  std::string feeder_id;    // empty: host:pid
  // The target folder on this host (config.json, safetensors, tokenizer); it must be the job's
  // target, which its fingerprint proves at the join.
  std::string target_path;
  std::string listen = "0.0.0.0:0";  // the FetchShard service (port 0: any)
  // host:port workers reach the service by (a host alone: with the bound port; under TLS, a name
  // its certificate holds); empty: the address this host reaches the coordinator from (or the
  // listen address when bound to one host) and the bound port.
  std::string advertise;
  std::string port_file;                        // the bound port is written here once serving
  uint64_t max_bytes = kDefaultFeederMaxBytes;  // computed features held at most
  int threads = 1;                              // compute threads
  double connect_timeout_seconds = 60;
  ClientSecurity security;  // to the coordinator; its job secret also guards FetchShard
  // The service's certificate and key (PEM) when the job uses TLS; workers verify it with the
  // job's CA (deploy/make-certs.sh issues one per feeder).
  std::string serve_tls_cert;
  std::string serve_tls_key;
  // Its /metrics (host:port; port 0 picks one). Empty: the job's metrics.worker_listen; "off":
  // none. The bound port is written to metrics_port_file when set.
  std::string metrics_listen;
  std::string metrics_port_file;
  // FLASHDRAFT_FAULT=slow-feeder:ms=N (feeder/feeder_fault.h): each shard's forward takes at least
  // N ms per sample (and each regenerated line N ms), standing in for a device's capture time.
  // 0: as fast as it computes.
  int slow_ms_per_sample = 0;
};

// Until the job ends (OK) or fails.
absl::Status RunFeeder(const FeederOptions& options);

}  // namespace flashdraft
