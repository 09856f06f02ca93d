// The client-side security flags shared by flashdraft-worker and `flashdraft status`
// (docs/SECURITY.md). Paths only: the job secret itself never appears on a command line.
#pragma once

#include <string>

#include "common/security.h"

namespace CLI {
class App;
}  // namespace CLI

namespace flashdraft {

// --tls-ca, --tls-cert, --tls-key, --tls-server-name, --token-file, or instead of them --job: the
// job file's security section (ClientSecurityFromJob resolves the two).
void AddClientSecurityFlags(CLI::App& app, ClientSecurity& s, std::string& job_path);

}  // namespace flashdraft
