#include "common/security_flags.h"

#include <CLI/CLI.hpp>
#include <vector>

namespace flashdraft {

void AddClientSecurityFlags(CLI::App& app, ClientSecurity& s, std::string& job_path) {
  std::vector<CLI::Option*> flags = {
      app.add_option("--tls-ca", s.tls_ca,
                     "PEM CA that signed the coordinator's certificate (turns TLS on)"),
      app.add_option("--tls-cert", s.tls_cert, "PEM client certificate, for mutual TLS"),
      app.add_option("--tls-key", s.tls_key, "PEM private key of --tls-cert"),
      app.add_option("--tls-server-name", s.server_name,
                     "name in the coordinator's certificate when the address is not (e.g. an IP)"),
      app.add_option("--token-file", s.token_file,
                     "file holding the job secret (the job's security.token_file)")};
  CLI::Option* job = app.add_option(
      "--job", job_path,
      "take the TLS files and the job secret from this job file's security section "
      "(client_cert/client_key, tls_ca, server_name, token_file) instead of the flags");
  for (CLI::Option* f : flags) job->excludes(f);
}

}  // namespace flashdraft
