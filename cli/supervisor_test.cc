#include "cli/supervisor.h"

#include <signal.h>

#include <string>
#include <utility>
#include <vector>

#include "cli/fake_process_launcher.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashdraft {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

class RecordingConsole : public LaunchConsole {
 public:
  void OpenLog(const std::string& name, bool again) override {
    opened.push_back(name + (again ? " again" : ""));
  }
  void ChildLine(const std::string& name, const std::string& line) override {
    lines.push_back(name + ": " + line);
  }
  void Note(const std::string& text) override { notes.push_back(text); }

  std::vector<std::string> opened, lines, notes;
};

class FakeStopSignal : public StopSignal {
 public:
  int Received() const override { return signal; }
  int signal = 0;
};

constexpr int kPort = 4321;

// A coordinator that writes its port 1 s after it starts, and two workers.
class SupervisorTest : public ::testing::Test {
 protected:
  SupervisorTest() { options_.restart.max_restarts = 2; }

  Supervisor& supervisor() {
    if (!supervisor_) {
      supervisor_ = std::make_unique<Supervisor>(launcher_, clock_, stop_, console_, options_);
    }
    return *supervisor_;
  }
  // Starts the coordinator and `workers` workers: the coordinator is process 100, worker-r 101+r.
  void StartJob(int workers = 2) {
    ASSERT_TRUE(supervisor().StartCoordinator({"coordinator"}).ok());
    const double listening_at = clock_.Now() + 1;
    absl::StatusOr<int> port =
        supervisor().WaitForCoordinator([&] { return clock_.Now() >= listening_at ? kPort : 0; });
    ASSERT_TRUE(port.ok()) << port.status();
    ASSERT_EQ(*port, kPort);
    supervisor().SetCoordinatorRestartArgs({"--resume"});
    for (int r = 0; r < workers; ++r) {
      const std::string name = "worker-" + std::to_string(r);
      ASSERT_TRUE(supervisor().StartWorker(name, {"worker", name}).ok());
    }
  }
  // The job ends by itself at `at`: the coordinator exits with `code`, the workers follow at once.
  void CoordinatorExitsAt(double at, int code) {
    launcher_.At(at, [this, code] { launcher_.Exit(kCoordinator, code); });
  }
  std::vector<double> StartTimes(const std::string& arg) {
    std::vector<double> times;
    for (ProcessId id : launcher_.Started(arg)) times.push_back(launcher_.process(id).started_at);
    return times;
  }

  static constexpr ProcessId kCoordinator = 100, kWorker0 = 101, kWorker1 = 102;
  FakeClock clock_{0};
  FakeProcessLauncher launcher_{clock_};
  FakeStopSignal stop_;
  RecordingConsole console_;
  SupervisorOptions options_;
  std::unique_ptr<Supervisor> supervisor_;
};

TEST(RestartPolicyTest, BackOffDoublesUpToThirtySeconds) {
  std::vector<int> backoffs;
  for (int restarts = 0; restarts < 8; ++restarts) {
    backoffs.push_back(RestartPolicy::BackoffSeconds(restarts));
  }
  EXPECT_THAT(backoffs, ElementsAre(1, 2, 4, 8, 16, 30, 30, 30));
}

TEST(JobOutcomeTest, ExitCodeFollowsTheCoordinatorUnlessInterrupted) {
  JobOutcome outcome;
  outcome.coordinator_exit_code = 0;
  EXPECT_EQ(outcome.ExitCode(), 0);
  outcome.coordinator_exit_code = 3;
  EXPECT_EQ(outcome.ExitCode(), 1);
  outcome.interrupted = true;
  EXPECT_EQ(outcome.ExitCode(), 130);
}

TEST_F(SupervisorTest, TheCoordinatorsExitEndsTheJobWithItsCode) {
  StartJob();
  CoordinatorExitsAt(10, 2);
  const JobOutcome outcome = supervisor().Run();
  EXPECT_EQ(outcome.coordinator_exit_code, 2);
  EXPECT_EQ(outcome.ExitCode(), 1);
  EXPECT_FALSE(outcome.interrupted);
  // The workers still running are told to stop (they exit 0): nobody failed.
  EXPECT_THAT(launcher_.signal_log(),
              ElementsAre(Pair(kWorker0, SIGTERM), Pair(kWorker1, SIGTERM)));
  EXPECT_TRUE(outcome.failed_workers.empty());
  EXPECT_EQ(outcome.worker_restarts, 0);
}

TEST_F(SupervisorTest, ASuccessfulJobExitsZero) {
  StartJob();
  launcher_.At(5, [this] {
    launcher_.Exit(kWorker0, 0);
    launcher_.Exit(kWorker1, 0);
    launcher_.Exit(kCoordinator, 0);
  });
  const JobOutcome outcome = supervisor().Run();
  EXPECT_EQ(outcome.ExitCode(), 0);
  EXPECT_TRUE(launcher_.signal_log().empty());
}

TEST_F(SupervisorTest, OutputIsSplitIntoLinesPerChild) {
  StartJob(1);
  launcher_.At(2, [this] {
    launcher_.Print(kCoordinator, "step 1\nst");
    launcher_.Print(kWorker0, "joined\n");
  });
  launcher_.At(3, [this] { launcher_.Print(kCoordinator, "ep 2\nno newline"); });
  CoordinatorExitsAt(4, 0);
  supervisor().Run();
  EXPECT_THAT(console_.lines, ElementsAre("coordinator: step 1", "worker-0: joined",
                                          "coordinator: step 2", "coordinator: no newline"));
  EXPECT_THAT(console_.opened, ElementsAre("coordinator", "worker-0"));
}

TEST_F(SupervisorTest, ACrashedWorkerIsStartedAgainAfterTheBackOff) {
  StartJob();
  const double crash = 5;
  launcher_.At(crash, [this] { launcher_.Kill(kWorker1, SIGKILL); });
  CoordinatorExitsAt(20, 0);
  const JobOutcome outcome = supervisor().Run();

  const std::vector<double> starts = StartTimes("worker-1");
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_GE(starts[1], crash + 1);        // 1 s of back-off
  EXPECT_LT(starts[1], crash + 1 + 0.5);  // and not much more
  EXPECT_EQ(launcher_.process(launcher_.Started("worker-1")[1]).argv,
            (std::vector<std::string>{"worker", "worker-1"}));
  EXPECT_THAT(console_.notes,
              ElementsAre("worker-1 exited with code 137; starting it again in 1 s (1 of 2)"));
  EXPECT_THAT(console_.opened,
              ElementsAre("coordinator", "worker-0", "worker-1", "worker-1 again"));
  EXPECT_EQ(outcome.worker_restarts, 1);
  EXPECT_TRUE(outcome.failed_workers.empty());  // its replacement exited 0 at the job's end
  EXPECT_EQ(outcome.ExitCode(), 0);
}

TEST_F(SupervisorTest, RestartsAreBoundedAndTheBackOffGrows) {
  StartJob();
  // worker-0 fails with code 3 a second after each start.
  launcher_.on_spawn = [this](ProcessId id, FakeProcessLauncher::Process& p) {
    if (p.argv.back() != "worker-0") return;
    launcher_.At(clock_.Now() + 1, [this, id] { launcher_.Exit(id, 3); });
  };
  launcher_.At(1.5, [this] { launcher_.Exit(kWorker0, 3); });  // the first one, started before
  CoordinatorExitsAt(60, 0);
  const JobOutcome outcome = supervisor().Run();

  const std::vector<double> starts = StartTimes("worker-0");
  ASSERT_EQ(starts.size(), 3u);  // max_restarts = 2
  // Exits at 1.5 → again 1 s later; exits 1 s after that → again 2 s later.
  EXPECT_NEAR(starts[1] - 1.5, 1, 0.2);
  EXPECT_NEAR(starts[2] - (starts[1] + 1), 2, 0.2);
  EXPECT_THAT(console_.notes,
              ElementsAre("worker-0 exited with code 3; starting it again in 1 s (1 of 2)",
                          "worker-0 exited with code 3; starting it again in 2 s (2 of 2)"));
  ASSERT_EQ(outcome.failed_workers.size(), 1u);
  EXPECT_EQ(outcome.failed_workers[0].name, "worker-0");
  EXPECT_EQ(outcome.failed_workers[0].exit.exit_code, 3);
  EXPECT_EQ(outcome.worker_restarts, 2);
  EXPECT_EQ(outcome.ExitCode(), 0);  // the coordinator's code, not the workers'
}

TEST_F(SupervisorTest, NoRestartsWhenTheLimitIsZero) {
  options_.restart.max_restarts = 0;
  StartJob();
  launcher_.At(5, [this] { launcher_.Exit(kWorker0, 1); });
  CoordinatorExitsAt(20, 0);
  const JobOutcome outcome = supervisor().Run();
  EXPECT_EQ(StartTimes("worker-0").size(), 1u);
  EXPECT_TRUE(console_.notes.empty());
  ASSERT_EQ(outcome.failed_workers.size(), 1u);
  EXPECT_EQ(outcome.worker_restarts, 0);
}

TEST_F(SupervisorTest, AWorkerLeavingWithCodeZeroIsNotRestarted) {
  StartJob();
  launcher_.At(5, [this] { launcher_.Exit(kWorker0, 0); });
  CoordinatorExitsAt(20, 0);
  supervisor().Run();
  EXPECT_EQ(StartTimes("worker-0").size(), 1u);
}

TEST_F(SupervisorTest, NoWorkerIsRestartedOnceTheCoordinatorEnded) {
  StartJob();
  // The worker crashes; the coordinator ends during its back-off.
  launcher_.At(5, [this] { launcher_.Kill(kWorker0, SIGSEGV); });
  CoordinatorExitsAt(5.5, 0);
  const JobOutcome outcome = supervisor().Run();
  EXPECT_EQ(StartTimes("worker-0").size(), 1u);
  ASSERT_EQ(outcome.failed_workers.size(), 1u);
  EXPECT_EQ(outcome.failed_workers[0].exit.term_signal, SIGSEGV);
  EXPECT_EQ(outcome.failed_workers[0].exit.exit_code, 128 + SIGSEGV);
}

TEST_F(SupervisorTest, AStopSignalStopsTheCoordinatorFirstThenKillsWhatRemains) {
  options_.grace_seconds = 15;
  StartJob();
  // The workers do not react to the coordinator's end by themselves.
  launcher_.process(kWorker0).ignores_sigterm = true;
  launcher_.process(kWorker1).ignores_sigterm = true;
  launcher_.At(5, [this] { stop_.signal = SIGINT; });
  const JobOutcome outcome = supervisor().Run();

  EXPECT_THAT(console_.notes, ElementsAre("stopping (signal 2)"));
  // SIGTERM to the coordinator only; after the grace period SIGKILL to the workers left.
  EXPECT_THAT(
      launcher_.signal_log(),
      ElementsAre(Pair(kCoordinator, SIGTERM), Pair(kWorker0, SIGKILL), Pair(kWorker1, SIGKILL)));
  EXPECT_GE(clock_.Now(), 5 + 15);
  EXPECT_LT(clock_.Now(), 5 + 15 + 1);
  EXPECT_TRUE(outcome.interrupted);
  EXPECT_EQ(outcome.ExitCode(), 130);
}

TEST_F(SupervisorTest, AStopSignalEndsTheJobWhenTheWorkersFollowTheCoordinator) {
  StartJob();
  launcher_.At(5, [this] { stop_.signal = SIGTERM; });
  // The coordinator takes 2 s to checkpoint; its workers exit 0 when it is gone.
  launcher_.process(kCoordinator).ignores_sigterm = true;
  launcher_.At(7, [this] {
    launcher_.Exit(kCoordinator, 0);
    launcher_.Exit(kWorker0, 0);
    launcher_.Exit(kWorker1, 0);
  });
  const JobOutcome outcome = supervisor().Run();
  EXPECT_THAT(launcher_.signal_log(), ElementsAre(Pair(kCoordinator, SIGTERM)));
  EXPECT_LT(clock_.Now(), 8);
  EXPECT_TRUE(outcome.failed_workers.empty());
  EXPECT_EQ(outcome.ExitCode(), 130);
}

TEST_F(SupervisorTest, NothingIsRestartedAfterAStopSignal) {
  StartJob();
  launcher_.At(5, [this] {
    stop_.signal = SIGTERM;
    launcher_.Kill(kWorker0, SIGKILL);
  });
  supervisor().Run();
  EXPECT_EQ(StartTimes("worker-0").size(), 1u);
}

TEST_F(SupervisorTest, WorkersThatIgnoreTheJobsEndAreKilledAfterTheGracePeriod) {
  options_.grace_seconds = 15;
  StartJob(1);
  launcher_.process(kWorker0).ignores_sigterm = true;
  CoordinatorExitsAt(10, 0);
  const JobOutcome outcome = supervisor().Run();
  EXPECT_THAT(launcher_.signal_log(),
              ElementsAre(Pair(kWorker0, SIGTERM), Pair(kWorker0, SIGKILL)));
  EXPECT_NEAR(clock_.Now(), 10 + 15, 0.5);
  ASSERT_EQ(outcome.failed_workers.size(), 1u);
  EXPECT_EQ(outcome.failed_workers[0].exit.term_signal, SIGKILL);
}

TEST_F(SupervisorTest, ACrashedCoordinatorIsRestartedWithItsRestartArgsWhenAllowed) {
  options_.restart.restart_coordinator = true;
  options_.restart.max_restarts = 1;
  StartJob();
  launcher_.At(5, [this] { launcher_.Kill(kCoordinator, SIGKILL); });
  // The second coordinator finishes the job.
  launcher_.At(30, [this] { launcher_.Exit(launcher_.Started("coordinator").back(), 0); });
  const JobOutcome outcome = supervisor().Run();

  const std::vector<ProcessId> coordinators = launcher_.Started("coordinator");
  ASSERT_EQ(coordinators.size(), 2u);
  EXPECT_EQ(launcher_.process(coordinators[1]).argv,
            (std::vector<std::string>{"coordinator", "--resume"}));
  EXPECT_NEAR(launcher_.process(coordinators[1]).started_at, 6, 0.2);
  // The workers waited for it: nobody was stopped while it was down.
  EXPECT_THAT(launcher_.signal_log(),
              ElementsAre(Pair(kWorker0, SIGTERM), Pair(kWorker1, SIGTERM)));
  EXPECT_THAT(console_.notes,
              ElementsAre("coordinator exited with code 137; starting it again in 1 s (1 of 1)"));
  EXPECT_EQ(outcome.coordinator_exit_code, 0);
  EXPECT_EQ(outcome.worker_restarts, 0);  // as before: only the workers' restarts are counted
  EXPECT_EQ(outcome.ExitCode(), 0);
}

TEST_F(SupervisorTest, ACrashedCoordinatorEndsTheJobWithoutResume) {
  StartJob();
  launcher_.At(5, [this] { launcher_.Kill(kCoordinator, SIGKILL); });
  const JobOutcome outcome = supervisor().Run();
  EXPECT_EQ(launcher_.Started("coordinator").size(), 1u);
  EXPECT_EQ(outcome.coordinator_exit_code, 137);
  EXPECT_EQ(outcome.ExitCode(), 1);
}

TEST_F(SupervisorTest, ACoordinatorThatCannotBeStartedAgainIsReported) {
  options_.restart.restart_coordinator = true;
  StartJob();
  launcher_.At(5, [this] {
    launcher_.Kill(kCoordinator, SIGKILL);
    launcher_.FailNextSpawn();
  });
  const JobOutcome outcome = supervisor().Run();
  EXPECT_THAT(console_.notes,
              ElementsAre(HasSubstr("starting it again in 1 s"), "cannot start coordinator again"));
  EXPECT_EQ(outcome.coordinator_exit_code, 137);
}

TEST_F(SupervisorTest, ACoordinatorThatExitsBeforeListeningIsReported) {
  ASSERT_TRUE(supervisor().StartCoordinator({"coordinator"}).ok());
  launcher_.At(0.5, [this] {
    launcher_.Print(kCoordinator, "bad job\n");
    launcher_.Exit(kCoordinator, 1);
  });
  absl::StatusOr<int> port = supervisor().WaitForCoordinator([] { return 0; });
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().message(), "the coordinator exited with code 1");
  EXPECT_THAT(console_.lines, ElementsAre("coordinator: bad job"));
}

TEST_F(SupervisorTest, ACoordinatorThatNeverListensIsKilledAtTheStartTimeout) {
  options_.start_timeout_seconds = 60;
  ASSERT_TRUE(supervisor().StartCoordinator({"coordinator"}).ok());
  absl::StatusOr<int> port = supervisor().WaitForCoordinator([] { return 0; });
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().message(), "the coordinator did not start listening (silent for 60 s)");
  EXPECT_THAT(launcher_.signal_log(), ElementsAre(Pair(kCoordinator, SIGKILL)));
  EXPECT_NEAR(clock_.Now(), 60, 0.2);
}

// A stop (SIGTERM to launch or run-rank) while the coordinator starts is a stop, not a failure to
// start: it is killed (it has nothing to checkpoint yet) and the wait says so.
TEST_F(SupervisorTest, AStopWhileTheCoordinatorStartsIsCancelled) {
  ASSERT_TRUE(supervisor().StartCoordinator({"coordinator"}).ok());
  launcher_.At(5, [this] { stop_.signal = SIGTERM; });
  absl::StatusOr<int> port = supervisor().WaitForCoordinator([] { return 0; });
  EXPECT_TRUE(absl::IsCancelled(port.status())) << port.status();
  EXPECT_THAT(launcher_.signal_log(), ElementsAre(Pair(kCoordinator, SIGKILL)));
}

// A coordinator that reports progress (tokenizing and regenerating a large data set) is waited
// for however long it takes to listen; the start timeout counts only its silence.
TEST_F(SupervisorTest, ACoordinatorReportingProgressIsWaitedForPastTheStartTimeout) {
  options_.start_timeout_seconds = 60;
  ASSERT_TRUE(supervisor().StartCoordinator({"coordinator"}).ok());
  for (double at = 30; at < 300; at += 30) {
    launcher_.At(at, [this] { launcher_.Print(kCoordinator, "tokenizing: 10%\n"); });
  }
  absl::StatusOr<int> port =
      supervisor().WaitForCoordinator([&] { return clock_.Now() >= 300 ? kPort : 0; });
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(*port, kPort);
  EXPECT_THAT(launcher_.signal_log(), ::testing::IsEmpty());
}

TEST_F(SupervisorTest, AStopSignalWhileTheCoordinatorStartsKillsIt) {
  ASSERT_TRUE(supervisor().StartCoordinator({"coordinator"}).ok());
  launcher_.At(2, [this] { stop_.signal = SIGINT; });
  absl::StatusOr<int> port = supervisor().WaitForCoordinator([] { return 0; });
  ASSERT_FALSE(port.ok());
  EXPECT_THAT(launcher_.signal_log(), ElementsAre(Pair(kCoordinator, SIGKILL)));
  EXPECT_LT(clock_.Now(), 3);
}

TEST_F(SupervisorTest, WithoutACoordinatorThereIsNothingToWaitForOrRun) {
  EXPECT_EQ(supervisor().WaitForCoordinator([] { return kPort; }).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(supervisor().Run().ExitCode(), 1);
}

TEST_F(SupervisorTest, StartFailuresAreErrors) {
  launcher_.FailNextSpawn();
  EXPECT_FALSE(supervisor().StartCoordinator({"coordinator"}).ok());
  ASSERT_TRUE(supervisor().StartCoordinator({"coordinator"}).ok());
  launcher_.FailNextSpawn();
  EXPECT_FALSE(supervisor().StartWorker("worker-0", {"worker", "worker-0"}).ok());
  supervisor().SignalAll(SIGTERM);
  EXPECT_THAT(launcher_.signal_log(),
              ElementsAre(Pair(launcher_.Started("coordinator").back(), SIGTERM)));
}

}  // namespace
}  // namespace flashdraft
