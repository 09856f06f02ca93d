// `flashdraft status ADDR [--json] [--watch SECONDS] [--drain WORKER]`: ask a running coordinator
// how the job is going, or make a worker leave.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "common/security.h"
#include "common/security_flags.h"
#include "flashdraft/v1/coordinator.grpc.pb.h"

namespace flashdraft {
namespace {

// A failed call to the coordinator at `address`, said plainly.
absl::Status CallFailed(const std::string& address, const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return absl::UnauthenticatedError(
        absl::StrCat("the coordinator at ", address, " ", s.error_message(), " (--token-file)"));
  }
  return absl::UnavailableError(
      absl::StrCat("no coordinator answering at ", address, ": ", s.error_message()));
}

// `flashdraft status ADDR --drain WORKER`: WORKER is a rank of the current epoch or a worker id.
int Drain(const std::string& address, const ClientSecurity& security, const std::string& worker) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateSecureChannel(address, security);
  if (!channel.ok()) return Fail(channel.status());
  auto stub = v1::Coordinator::NewStub(*channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::DrainRequest request;
  uint32_t rank = 0;
  if (absl::SimpleAtoi(worker, &rank)) {
    request.set_rank(rank);
  } else {
    request.set_worker_id(worker);
  }
  v1::DrainReply reply;
  grpc::Status s = stub->Drain(&ctx, request, &reply);
  if (!s.ok()) return Fail(CallFailed(address, s));
  if (!reply.accepted())
    return Fail(absl::NotFoundError("--drain " + worker + ": " + reply.message()));
  std::printf("%s\n", reply.message().c_str());
  return 0;
}

// "45s", "4m05s", "2h03m".
std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

// The target feeders' rows (docs/ARCHITECTURE.md, "Feeders"), when the job has any.
void AppendFeeders(const v1::StatusReply& r, std::string& out) {
  if (r.feeders_size() == 0) return;
  absl::StrAppendFormat(&out, "  %-24s %-22s %8s %10s %9s %8s\n", "FEEDER", "SERVES AT", "HEARD",
                        "HELD", "COMPUTED", "PENDING");
  for (const v1::FeederRow& f : r.feeders()) {
    absl::StrAppendFormat(
        &out, "  %-24s %-22s %8s %8.1fMB %9d %8d\n", f.feeder_id(), f.serve_address(),
        f.seconds_since_heard() < 0 ? "joining" : absl::StrFormat("%.1fs", f.seconds_since_heard()),
        f.held_bytes() / 1e6, f.shards_computed(), f.shards_pending());
  }
}

// The status as a person reads it at a glance.
std::string FormatStatus(const v1::StatusReply& r) {
  const std::string state =
      r.paused_reason().empty() ? r.state() : absl::StrCat(r.state(), ": ", r.paused_reason());
  std::string out =
      absl::StrFormat("job %s  state %s  step %d/%d  workers %d  epoch %d\n", r.job_name(), state,
                      r.step(), r.total_steps(), r.world_size(), r.membership_epoch());
  if (r.step() > 0) {
    absl::StrAppendFormat(&out, "  %.0f%% done",
                          100.0 * r.step() / std::max<uint64_t>(1, r.total_steps()));
    if (r.eta_seconds() > 0 && r.state() == "training") {
      absl::StrAppend(&out, ", ETA ", Duration(r.eta_seconds()));
    }
    absl::StrAppendFormat(&out, "   loss %.4f  tau %.3f  %.0f tok/s  %.3f s/step\n", r.loss(),
                          r.tau_estimate(), r.tokens_per_second(), r.step_seconds());
  }
  if (r.last_checkpoint_step() == 0) {
    absl::StrAppend(&out, "  last checkpoint: none yet\n");
  } else if (r.last_checkpoint_age_seconds() < 0) {
    absl::StrAppend(&out, "  last checkpoint: step ", r.last_checkpoint_step(),
                    " (resumed from it)\n");
  } else {
    absl::StrAppend(&out, "  last checkpoint: step ", r.last_checkpoint_step(), ", ",
                    Duration(r.last_checkpoint_age_seconds()), " ago\n");
  }
  if (r.workers_size() > 0) {
    absl::StrAppendFormat(&out, "  %-24s %-7s %4s  %-10s %7s %8s %10s\n", "WORKER", "STATE", "RANK",
                          "PHASE", "STEP", "HEARD", "STEP TIME");
  }
  for (const v1::WorkerStatus& w : r.workers()) {
    absl::StrAppendFormat(&out, "  %-24s %-7s %4s  %-10s %7d %7.1fs %10s%s\n", w.worker_id(),
                          w.state(), w.rank() >= 0 ? absl::StrCat(w.rank()) : "-", w.phase(),
                          w.step(), w.seconds_since_heard(),
                          w.step_seconds() > 0 ? absl::StrFormat("%.3fs", w.step_seconds()) : "-",
                          w.leaving() ? "  (leaving)" : "");
  }
  AppendFeeders(r, out);
  return out;
}

// `flashdraft status ADDR [--json] [--watch SECONDS]`.
int PrintStatus(const std::string& address, const ClientSecurity& security, bool json,
                double watch_seconds) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateSecureChannel(address, security);
  if (!channel.ok()) return Fail(channel.status());
  auto stub = v1::Coordinator::NewStub(*channel);
  const bool terminal = isatty(STDOUT_FILENO) == 1;
  for (int round = 0;; ++round) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::StatusReply reply;
    grpc::Status s = stub->Status(&ctx, v1::StatusRequest(), &reply);
    // Once it answered: a coordinator shutting down cancels the call, a gone one is unavailable.
    if (!s.ok() && round > 0 &&
        (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::CANCELLED)) {
      std::printf("the coordinator at %s is gone: the job ended or it was stopped\n",
                  address.c_str());
      return 0;
    }
    if (!s.ok()) {
      absl::Status failed = CallFailed(address, s);
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
        failed = absl::UnavailableError(
            absl::StrCat(failed.message(),
                         " (a finished job's coordinator exits: its results are in the "
                         "job's output_dir)"));
      }
      return Fail(failed);
    }
    if (json) {
      std::string text;
      google::protobuf::util::JsonPrintOptions options;
      options.preserve_proto_field_names = true;
      options.always_print_primitive_fields = true;
      (void)google::protobuf::util::MessageToJsonString(reply, &text, options);
      std::printf("%s\n", text.c_str());
    } else {
      if (watch_seconds > 0 && terminal) std::printf("\033[H\033[2J");  // in place
      std::printf("%s", FormatStatus(reply).c_str());
    }
    std::fflush(stdout);
    if (watch_seconds <= 0 || reply.state() == "done" || reply.state() == "failed") return 0;
    if (!terminal && !json) std::printf("\n");
    std::this_thread::sleep_for(
        std::chrono::milliseconds(static_cast<int64_t>(watch_seconds * 1000)));
  }
}

class StatusCommand : public Command {
 public:
  explicit StatusCommand(CLI::App& parent)
      : Command(parent.add_subcommand("status", "Ask a running coordinator how the job is going")) {
    app().add_option("coordinator", address_, "host:port")->required();
    app().add_option("--drain", drain_worker_,
                     "make this worker (a rank of the current epoch, or a worker id) leave at "
                     "the next step boundary");
    app().add_flag("--json", json_, "print the coordinator's reply as JSON (for scripts)");
    app()
        .add_option("--watch", watch_seconds_,
                    "refresh every SECONDS (in place on a terminal) until the job ends")
        ->check(CLI::Range(0.1, 3600.0));
    AddClientSecurityFlags(app(), security_flags_, security_job_);
  }

  int Run() override {
    absl::StatusOr<ClientSecurity> security = ClientSecurityFromJob(security_job_, security_flags_);
    if (!security.ok()) return Fail(security.status());
    if (!drain_worker_.empty()) return Drain(address_, *security, drain_worker_);
    return PrintStatus(address_, *security, json_, watch_seconds_);
  }

 private:
  std::string address_;
  std::string drain_worker_;
  bool json_ = false;
  double watch_seconds_ = 0;
  ClientSecurity security_flags_;
  std::string security_job_;
};

}  // namespace

void AddStatusCommand(CLI::App& app, Commands& out) {
  out.push_back(std::make_unique<StatusCommand>(app));
}

}  // namespace flashdraft
