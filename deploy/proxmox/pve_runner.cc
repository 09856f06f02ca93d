#include "deploy/proxmox/pve_runner.h"

#include <sys/wait.h>

#include <cstdio>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace flashdraft {

std::string ShellWord(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789@%+=:,./-_") == std::string::npos) {
    return s;
  }
  return "'" + absl::StrReplaceAll(s, {{"'", "'\\''"}}) + "'";
}

ShellResult RunShell(const std::string& command) {
  ShellResult r;
  FILE* pipe = popen(("( " + command + " ) 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) r.output.append(buffer, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

ShellResult Runner::Host(const std::string& command) const {
  return RunShell("ssh -o BatchMode=yes " + ShellWord(host_) + " " + ShellWord(command));
}

std::string DryRunText(const Step& s) {
  std::string check = s.check;
  std::string action = s.action;
  if (absl::StrContains(check, "&&") || absl::StrContains(check, "||")) {
    check = "( " + check + " )";
  }
  if (!check.empty() && (absl::StrContains(action, "&&") || absl::StrContains(action, ";"))) {
    action = "{ " + action + "; }";
  }
  return absl::StrCat("# ", s.what, s.local ? " (on this machine)" : "", "\n",
                      check.empty() ? "" : check + " || ", action, "\n");
}

absl::Status Runner::Apply(const std::vector<Step>& steps) {
  for (const Step& s : steps) {
    if (dry_run_) {
      std::cout << DryRunText(s);
      continue;
    }
    if (absl::Status st = ApplyOne(s); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status Runner::ApplyOne(const Step& s) {
  if (!s.check.empty()) {
    ShellResult c = s.local ? RunShell(s.check) : Host(s.check);
    if (!s.local && c.exit_code == 255) {  // ssh's own failure, not the check's answer
      return absl::UnavailableError(
          absl::StrCat("cannot reach the Proxmox host ", host_, " over ssh: ", c.output));
    }
    if (c.exit_code == 0) {
      std::cout << "  unchanged  " << s.what << "\n" << std::flush;
      return absl::OkStatus();
    }
  }
  ShellResult a = s.local ? RunShell(s.action) : Host(s.action);
  if (a.exit_code != 0) {
    return absl::InternalError(absl::StrCat(s.what, ": `", s.action, "` failed with exit code ",
                                            a.exit_code, ":\n", a.output));
  }
  ++changed_;
  std::cout << "  changed    " << s.what << "\n" << std::flush;
  return absl::OkStatus();
}

std::string PctExec(int id, const std::string& command) {
  return absl::StrCat("pct exec ", id, " -- ", command);
}

std::string PctExecSh(int id, const std::string& script) {
  return PctExec(id, "sh -c " + ShellWord(script));
}

}  // namespace flashdraft
