#include "cli/launch_console.h"

#include <cstdio>

namespace flashdraft {

void TerminalConsole::OpenLog(const std::string& name, bool again) {
  std::ofstream& log = logs_[name];
  if (log.is_open()) log.close();
  log.open(log_dir_ + "/" + name + ".log", again ? std::ios::app : std::ios::trunc);
}

void TerminalConsole::ChildLine(const std::string& name, const std::string& line) {
  std::printf("[%-11s] %s\n", name.c_str(), line.c_str());
  std::fflush(stdout);
  std::ofstream& log = logs_[name];
  log << line << "\n";
  log.flush();
}

void TerminalConsole::Note(const std::string& text) {
  std::printf("[launch     ] %s\n", text.c_str());
  std::fflush(stdout);
}

}  // namespace flashdraft
