// The real launcher against /bin/sh: output through the pipe, exit codes, signals.
#include "cli/posix_process_launcher.h"

#include <signal.h>

#include <chrono>
#include <map>
#include <string>

#include "gtest/gtest.h"

namespace flashdraft {
namespace {

// Reads until `id`'s output ends (or 10 s pass); all of it.
std::string ReadAll(PosixProcessLauncher& launcher, ProcessId id) {
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    for (const ProcessOutput& out : launcher.ReadOutput(0.1)) {
      if (out.id != id) continue;
      text += out.bytes;
      if (out.closed) return text;
    }
  }
  ADD_FAILURE() << "output did not end";
  return text;
}

std::optional<ProcessExit> WaitExit(PosixProcessLauncher& launcher, ProcessId id) {
  for (int i = 0; i < 1000; ++i) {
    if (auto exit = launcher.PollExit(id)) return exit;
    launcher.ReadOutput(0.01);
  }
  return std::nullopt;
}

TEST(PosixProcessLauncherTest, OutputAndExitCode) {
  PosixProcessLauncher launcher;
  absl::StatusOr<ProcessId> id =
      launcher.Spawn({"/bin/sh", "-c", "echo out; echo err >&2; printf tail; exit 3"});
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(ReadAll(launcher, *id), "out\nerr\ntail");
  std::optional<ProcessExit> exit = WaitExit(launcher, *id);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 3);
  EXPECT_EQ(exit->term_signal, 0);
  EXPECT_EQ(launcher.PollExit(*id)->exit_code, 3);  // stays
}

TEST(PosixProcessLauncherTest, ASignalEndsItAndIsReported) {
  PosixProcessLauncher launcher;
  absl::StatusOr<ProcessId> id = launcher.Spawn({"/bin/sh", "-c", "echo ready; exec sleep 30"});
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_FALSE(launcher.PollExit(*id).has_value());
  launcher.Signal(*id, SIGKILL);
  std::optional<ProcessExit> exit = WaitExit(launcher, *id);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->term_signal, SIGKILL);
  EXPECT_EQ(exit->exit_code, 128 + SIGKILL);
  launcher.Signal(*id, SIGKILL);  // reaped: nothing is sent
}

TEST(PosixProcessLauncherTest, AProgramThatCannotBeExecutedExits127) {
  PosixProcessLauncher launcher;
  absl::StatusOr<ProcessId> id = launcher.Spawn({"/nonexistent/program"});
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_NE(ReadAll(launcher, *id).find("exec /nonexistent/program failed"), std::string::npos);
  EXPECT_EQ(WaitExit(launcher, *id)->exit_code, 127);
}

}  // namespace
}  // namespace flashdraft
