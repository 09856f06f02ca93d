// The client-side security flags shared by flashdraft-worker and `flashdraft status`
// (docs/SECURITY.md). Paths only: the job secret itself never appears on a command line.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "common/security.h"

namespace flashdraft {

// --tls-ca, --tls-cert, --tls-key, --tls-server-name, --token-file, or instead of them --job: the
// job file's security section (ClientSecurityFromJob resolves the two).
inline void AddClientSecurityFlags(CLI::App& app, ClientSecurity& s, std::string& job_path) {
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
