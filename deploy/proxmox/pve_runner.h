// How flashdraft-pve changes a Proxmox host: every change is a Step, a check (run first: exit 0
// means already so) and an action, both shell commands run over ssh on the host (or here). That
// makes a second deploy change nothing and --dry-run print exactly what would run.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace flashdraft {

// `s` as one shell word: as is when it has no characters the shell treats specially.
std::string ShellWord(const std::string& s);

struct ShellResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `command` with /bin/sh here.
ShellResult RunShell(const std::string& command);

// One change: `check` (exit 0: already so; empty: always act) and `action`, both shell commands
// for the Proxmox host, or for this machine when `local`.
struct Step {
  std::string what;
  std::string check;
  std::string action;
  bool local = false;
};

class Runner {
 public:
  Runner(std::string host, bool dry_run) : host_(std::move(host)), dry_run_(dry_run) {}

  // On the Proxmox host.
  ShellResult Host(const std::string& command) const;

  // Runs (or prints) the steps in order; the first failure ends it. A host ssh cannot reach is
  // named as such, not taken for a check's "not done yet".
  absl::Status Apply(const std::vector<Step>& steps);

  int changed() const { return changed_; }

 private:
  absl::Status ApplyOne(const Step& step);

  std::string host_;
  bool dry_run_;
  int changed_ = 0;
};

// Steps print as one would type them: `check || action`, compound parts grouped.
std::string DryRunText(const Step& step);

// `pct exec <id> -- <command>`, and the same with a script for `sh -c`.
std::string PctExec(int id, const std::string& command);
std::string PctExecSh(int id, const std::string& script);

}  // namespace flashdraft
