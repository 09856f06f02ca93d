// Transport security for every flashdraft gRPC endpoint (docs/SECURITY.md): TLS or mutual TLS from
// PEM files, and the job secret, a bearer token every RPC carries ("authorization: Bearer ...").
// Files are read and checked once, at start, with errors that name the file and what is wrong
// (missing, not PEM, the key does not match the certificate, expired or not yet valid).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/job_config.h"

namespace flashdraft {

// --- PEM files ---

// A certificate chain and its private key: the first certificate must be valid now and match the
// key. `what` names them in errors (e.g. "security.tls_cert").
struct TlsIdentity {
  std::string cert_chain_pem;
  std::string private_key_pem;
};
absl::StatusOr<TlsIdentity> ReadTlsIdentity(const std::string& cert_path,
                                            const std::string& key_path, const std::string& what);
// One or more CA certificates, each valid now.
absl::StatusOr<std::string> ReadCaBundle(const std::string& path, const std::string& what);
// The job secret: the file's first line, at least 16 characters; the file must not be readable or
// writable by others (as ssh refuses a private key that is).
absl::StatusOr<std::string> ReadToken(const std::string& path, const std::string& what);

// --- Clients (workers, flashdraft status) ---

struct ClientSecurity {
  std::string tls_ca;    // set: TLS, the coordinator verified against this CA
  std::string tls_cert;  // with tls_key: this client's certificate (mutual TLS)
  std::string tls_key;
  std::string server_name;  // the name to expect in the coordinator's certificate
  std::string token_file;   // set: every call carries the job secret
  bool tls() const { return !tls_ca.empty(); }
};

// What a client started by `flashdraft launch` (or `status --job`) uses for this job.
ClientSecurity ClientSecurityFor(const SecurityConfig& security);
// `flags` when `job_path` is empty; otherwise ClientSecurityFor the security section of that job
// file (a worker or `status` on a host that shares the job file, e.g. under Slurm).
absl::StatusOr<ClientSecurity> ClientSecurityFromJob(const std::string& job_path,
                                                     const ClientSecurity& flags);

// A channel to `address` with these credentials (and the shared keepalive and size settings);
// errors name the file that is wrong.
// Channels of equal settings share one TCP (and TLS) connection in gRPC; channels made with
// different `connection` numbers each get their own.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateSecureChannel(const std::string& address,
                                                                   const ClientSecurity& security,
                                                                   int connection = 0);

// --- The coordinator ---

class ServerSecurity {
 public:
  // Reads and checks every file the job's security section names.
  static absl::StatusOr<std::unique_ptr<ServerSecurity>> Create(const SecurityConfig& security,
                                                                const Clock& clock);

  std::shared_ptr<grpc::ServerCredentials> credentials() const { return credentials_; }
  // "mutual TLS + token", "TLS", "none", "insecure" ...: for the start-up log and
  // flashdraft_build_info{security}.
  const std::string& description() const { return description_; }

  // OK when the call carries the job secret (or the job has none); UNAUTHENTICATED otherwise,
  // logged with the peer's address (at most one line a second, with a count of the rest).
  grpc::Status Authenticate(const grpc::ServerContextBase& context) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ServerSecurity(const Clock& clock) : clock_(clock) {}
  void LogRefusal(const std::string& peer, const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);

  const Clock& clock_;
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  std::string expected_header_;  // "Bearer <token>"; empty: no token
  std::string description_;
  absl::Mutex mu_;
  double last_log_ ABSL_GUARDED_BY(mu_) = -1e9;
  int suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

// Text a peer chose (a worker id, a tensor name), made safe to log and echo: at most `max_chars`
// of it, non-printable bytes escaped, "..." when cut.
std::string Untrusted(absl::string_view text, size_t max_chars = 64);

// Constant-time comparison (the time does not depend on where the strings differ).
bool SecretEquals(absl::string_view a, absl::string_view b);

}  // namespace flashdraft
