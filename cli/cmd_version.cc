// `flashdraft version`.
#include <cstdio>

#include "cli/command.h"

namespace flashdraft {
namespace {

class VersionCommand : public Command {
 public:
  explicit VersionCommand(CLI::App& parent)
      : Command(parent.add_subcommand("version", "Print the version")) {}

  int Run() override {
    std::printf("flashdraft %s\n", FLASHDRAFT_VERSION);
    return 0;
  }
};

}  // namespace

void AddVersionCommand(CLI::App& app, Commands& out) {
  out.push_back(std::make_unique<VersionCommand>(app));
}

}  // namespace flashdraft
