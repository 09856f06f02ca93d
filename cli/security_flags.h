// The client-side security flags shared by flashdraft-worker and `flashdraft status`
// (docs/SECURITY.md). Paths only: the job secret itself never appears on a command line.
#pragma once

#include <CLI/CLI.hpp>

#include "common/security.h"

namespace flashdraft {

inline void AddClientSecurityFlags(CLI::App& app, ClientSecurity& s) {
  app.add_option("--tls-ca", s.tls_ca,
                 "PEM CA that signed the coordinator's certificate (turns TLS on)");
  app.add_option("--tls-cert", s.tls_cert, "PEM client certificate, for mutual TLS");
  app.add_option("--tls-key", s.tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-server-name", s.server_name,
                 "name in the coordinator's certificate when the address is not (e.g. an IP)");
  app.add_option("--token-file", s.token_file,
                 "file holding the job secret (the job's security.token_file)");
}

}  // namespace flashdraft
