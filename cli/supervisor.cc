#include "cli/supervisor.h"

#include <signal.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace flashdraft {

namespace {
constexpr double kStartPollSeconds = 0.05;  // while the coordinator starts, and when draining
constexpr double kRunPollSeconds = 0.1;
}  // namespace

struct Supervisor::Child {
  std::string name;
  std::vector<std::string> argv;  // to start it again
  ProcessId id = 0;
  bool coordinator = false;
  bool output_open = true;
  std::string partial;  // an incomplete last line
  std::optional<ProcessExit> exit;
  int restarts = 0;                  // how many times this child was started again
  bool replaced = false;             // a newer process runs in its place
  std::optional<double> restart_at;  // when to start it again, once decided
  double last_output_at = 0;         // when it last wrote anything (or started)
};

int RestartPolicy::BackoffSeconds(int restarts) { return std::min(30, 1 << std::min(restarts, 5)); }

int JobOutcome::ExitCode() const {
  if (interrupted) return 130;
  return coordinator_exit_code == 0 ? 0 : 1;
}

Supervisor::Supervisor(ProcessLauncher& launcher, const Clock& clock, const StopSignal& stop,
                       LaunchConsole& console, SupervisorOptions options)
    : launcher_(launcher), clock_(clock), stop_(stop), console_(console), options_(options) {}

Supervisor::~Supervisor() = default;

absl::StatusOr<Supervisor::Child*> Supervisor::Start(const std::string& name,
                                                     const std::vector<std::string>& argv,
                                                     bool coordinator, int restarts) {
  console_.OpenLog(name, restarts > 0);
  absl::StatusOr<ProcessId> id = launcher_.Spawn(argv);
  if (!id.ok()) return id.status();
  auto child = std::make_unique<Child>();
  child->name = name;
  child->argv = argv;
  child->id = *id;
  child->coordinator = coordinator;
  child->restarts = restarts;
  children_.push_back(std::move(child));
  return children_.back().get();
}

absl::Status Supervisor::StartCoordinator(const std::vector<std::string>& argv) {
  absl::StatusOr<Child*> child = Start("coordinator", argv, /*coordinator=*/true, 0);
  if (!child.ok()) return child.status();
  coordinator_ = *child;
  return absl::OkStatus();
}

absl::Status Supervisor::StartWorker(const std::string& name,
                                     const std::vector<std::string>& argv) {
  return Start(name, argv, /*coordinator=*/false, 0).status();
}

void Supervisor::SetCoordinatorRestartArgs(std::vector<std::string> args) {
  coordinator_restart_args_ = std::move(args);
}

void Supervisor::SignalAll(int signal) {
  for (auto& c : children_) {
    if (!c->exit.has_value()) launcher_.Signal(c->id, signal);
  }
}

absl::StatusOr<int> Supervisor::WaitForCoordinator(const std::function<int()>& read_port) {
  if (coordinator_ == nullptr) return absl::FailedPreconditionError("no coordinator was started");
  coordinator_->last_output_at = clock_.Now();
  bool exited = false;
  while (true) {
    Pump(kStartPollSeconds);
    Reap();
    if (const int port = read_port(); port > 0) return port;
    exited = coordinator_->exit.has_value();
    const bool silent =
        clock_.Now() > coordinator_->last_output_at + options_.start_timeout_seconds;
    if (exited || stop_.Received() != 0 || silent) break;
  }
  SignalAll(SIGKILL);  // before it listens it has nothing to checkpoint
  DrainOutput(*coordinator_);
  if (exited) {
    return absl::UnavailableError(
        absl::StrCat("the coordinator exited with code ", coordinator_->exit->exit_code));
  }
  if (stop_.Received() != 0) {
    return absl::CancelledError("stopped before the coordinator listened");
  }
  return absl::DeadlineExceededError(
      absl::StrCat("the coordinator did not start listening (silent for ",
                   options_.start_timeout_seconds, " s)"));
}

// Interleaves the children's output, line by line, with a prefix.
void Supervisor::Pump(double timeout_seconds) {
  for (ProcessOutput& out : launcher_.ReadOutput(timeout_seconds)) {
    auto it = std::find_if(children_.begin(), children_.end(),
                           [&](const auto& c) { return c->id == out.id; });
    if (it == children_.end()) continue;
    Child& child = **it;
    if (!out.bytes.empty()) child.last_output_at = clock_.Now();
    child.partial.append(out.bytes);
    if (out.closed) child.output_open = false;
    EmitLines(child);
  }
}

void Supervisor::EmitLines(Child& c) {
  size_t nl;
  while ((nl = c.partial.find('\n')) != std::string::npos ||
         (!c.output_open && !c.partial.empty())) {
    const std::string line = nl == std::string::npos ? c.partial : c.partial.substr(0, nl);
    c.partial.erase(0, nl == std::string::npos ? std::string::npos : nl + 1);
    console_.ChildLine(c.name, line);
  }
}

void Supervisor::Reap() {
  for (auto& c : children_) {
    if (!c->exit.has_value()) c->exit = launcher_.PollExit(c->id);
  }
}

void Supervisor::DrainOutput(const Child& child) {
  while (child.output_open) Pump(kStartPollSeconds);
}

// A worker that failed while the job runs is started again (it rejoins at the next step
// boundary), up to max_restarts times each. With restart_coordinator, so is a failed coordinator;
// the workers join it again by themselves.
bool Supervisor::MayRestart(const Child& c) const {
  if (!c.exit.has_value() || c.replaced || c.exit->exit_code == 0 || interrupted_) return false;
  if (c.restarts >= options_.restart.max_restarts) return false;
  if (c.coordinator) return options_.restart.restart_coordinator;
  return !coordinator_->exit.has_value();
}

void Supervisor::RestartFailed() {
  const double now = clock_.Now();
  // By index: starting a child again appends to children_.
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& c = *children_[i];
    if (!MayRestart(c)) continue;
    if (!c.restart_at.has_value()) {
      const int backoff = RestartPolicy::BackoffSeconds(c.restarts);
      c.restart_at = now + backoff;
      console_.Note(absl::StrFormat("%s exited with code %d; starting it again in %d s (%d of %d)",
                                    c.name, c.exit->exit_code, backoff, c.restarts + 1,
                                    options_.restart.max_restarts));
    } else if (now >= *c.restart_at) {
      StartAgain(c);
    }
  }
}

void Supervisor::StartAgain(Child& c) {
  c.replaced = true;
  std::vector<std::string> argv = c.argv;
  // The coordinator's first restart adds its port and resume; later ones inherit them.
  if (c.coordinator && c.restarts == 0) {
    argv.insert(argv.end(), coordinator_restart_args_.begin(), coordinator_restart_args_.end());
  }
  absl::StatusOr<Child*> again = Start(c.name, argv, c.coordinator, c.restarts + 1);
  if (!again.ok()) {
    console_.Note(absl::StrCat("cannot start ", c.name, " again"));
  } else if (c.coordinator) {
    coordinator_ = *again;
  }
}

// The coordinator is waiting to be started again: nobody is stopped meanwhile.
bool Supervisor::CoordinatorRestarting() const {
  return coordinator_->exit.has_value() && !coordinator_->replaced &&
         coordinator_->restart_at.has_value();
}

// A stop request goes to the coordinator first (it checkpoints and lets its workers go); when the
// job is over, a worker still around (dropped near the end, joining again) stops trying at SIGTERM
// and exits 0, and one still exporting the drafter finishes first. After the grace period,
// SIGKILL.
void Supervisor::StopWhenDue() {
  const int signal = stop_.Received();
  if (signal != 0 && !interrupted_) {
    interrupted_ = true;
    console_.Note(absl::StrCat("stopping (signal ", signal, ")"));
    launcher_.Signal(coordinator_->id, SIGTERM);
    kill_at_ = clock_.Now() + options_.grace_seconds;
  }
  if (coordinator_->exit.has_value() && !CoordinatorRestarting() && !kill_at_.has_value()) {
    for (auto& c : children_) {
      if (!c->exit.has_value() && c.get() != coordinator_) launcher_.Signal(c->id, SIGTERM);
    }
    kill_at_ = clock_.Now() + options_.grace_seconds;
  }
}

bool Supervisor::AllExited() const {
  return std::all_of(children_.begin(), children_.end(),
                     [](const auto& c) { return c->exit.has_value(); });
}

JobOutcome Supervisor::Run() {
  if (coordinator_ == nullptr) return JobOutcome{};  // nothing to supervise: a failed job
  while (true) {
    Pump(kRunPollSeconds);
    Reap();
    RestartFailed();
    StopWhenDue();
    if (AllExited()) break;
    if (kill_at_.has_value() && clock_.Now() > *kill_at_) SignalAll(SIGKILL);
  }
  for (auto& c : children_) DrainOutput(*c);
  return Outcome();
}

JobOutcome Supervisor::Outcome() const {
  JobOutcome outcome;
  outcome.coordinator_exit_code = coordinator_->exit->exit_code;
  outcome.interrupted = interrupted_;
  for (const auto& c : children_) {
    if (c->coordinator) continue;
    if (!c->replaced && c->exit->exit_code != 0)
      outcome.failed_workers.push_back({c->name, *c->exit});
    outcome.worker_restarts += c->replaced;
  }
  return outcome;
}

}  // namespace flashdraft
