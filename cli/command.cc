#include "cli/command.h"

#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/multi_line_text.h"

namespace flashdraft {

int Fail(const absl::Status& status) {
  std::cerr << "flashdraft: error: " << status.message() << "\n";
  return 1;
}

int ExitCode(const absl::Status& status) { return status.ok() ? 0 : Fail(status); }

void AddChatOptionFlags(CLI::App& app, ChatRenderOptions& chat) {
  app.add_option("--enable-thinking", chat.enable_thinking,
                 "false: Qwen3's non-thinking mode, as the job's data.enable_thinking (reasoning "
                 "dropped, the empty think block in the prompt)")
      ->capture_default_str();
  app.add_option("--system-prompt", chat.system_prompt,
                 "the system turn of every chat without one, as the job's data.system_prompt")
      ->check([](const std::string& text) -> std::string {
        std::optional<std::string> problem = MultiLineTextProblem(text);
        return problem ? "the text " + *problem : "";
      });
}

absl::Status ParseLayerIds(const std::string& text, std::vector<int>& out) {
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError("--layers: '" + std::string(part) + "' is not an integer");
    }
    out.push_back(id);
  }
  return absl::OkStatus();
}

}  // namespace flashdraft
