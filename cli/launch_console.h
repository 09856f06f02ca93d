// Where `flashdraft launch` writes: each child's lines with a prefix on stdout and in
// <out>/logs/<name>.log, and its own messages as "[launch     ] ...".
#pragma once

#include <fstream>
#include <map>
#include <string>

namespace flashdraft {

class LaunchConsole {
 public:
  virtual ~LaunchConsole() = default;
  // Child `name` is about to start: its log begins anew, or goes on when it is started again.
  virtual void OpenLog(const std::string& name, bool again) = 0;
  // One line of its output, without the newline.
  virtual void ChildLine(const std::string& name, const std::string& line) = 0;
  // The launcher's own message, without the newline.
  virtual void Note(const std::string& text) = 0;
};

// stdout and the files in `log_dir`.
class TerminalConsole : public LaunchConsole {
 public:
  explicit TerminalConsole(std::string log_dir) : log_dir_(std::move(log_dir)) {}
  void OpenLog(const std::string& name, bool again) override;
  void ChildLine(const std::string& name, const std::string& line) override;
  void Note(const std::string& text) override;

 private:
  const std::string log_dir_;
  std::map<std::string, std::ofstream> logs_;
};

}  // namespace flashdraft
