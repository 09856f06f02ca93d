#include "coordinator/checkpoint_pipeline.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "model/drafter_export.h"

namespace flashdraft {

namespace fs = std::filesystem;

CheckpointPipeline::CheckpointPipeline(Options options, std::vector<TensorSpec> upload,
                                       Writer writer, std::function<std::string()> numerics,
                                       std::function<void(absl::Status)> on_failure,
                                       CoordinatorMetrics& metrics, StepLog& step_log,
                                       const Clock& clock)
    : options_(options),
      writer_(std::move(writer)),
      numerics_(std::move(numerics)),
      on_failure_(std::move(on_failure)),
      metrics_(metrics),
      step_log_(step_log),
      clock_(clock),
      receiver_(std::move(upload)),
      eval_thread_([this] { EvalLoop(); }) {}

CheckpointPipeline::~CheckpointPipeline() {
  Wait();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    evals_.clear();
  }
  eval_thread_.join();
}

namespace {

// The best-checkpoint record: {"completed_steps": N, "checkpoint": "<dir name>", "tau": τ}, the
// directory named relative to the record's own, so a moved checkpoint folder still resolves.
std::string BestRecordJson(const CheckpointPipeline::Best& best) {
  const nlohmann::json j = {{"completed_steps", best.completed_steps},
                            {"checkpoint", fs::path(best.dir).filename().string()},
                            {"tau", best.tau}};
  return j.dump(2) + "\n";
}

absl::StatusOr<CheckpointPipeline::Best> ReadBestRecord(const std::string& path) {
  FD_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("completed_steps") ||
      !j["completed_steps"].is_number_unsigned() || !j.contains("checkpoint") ||
      !j["checkpoint"].is_string() || !j.contains("tau") || !j["tau"].is_number()) {
    return absl::DataLossError(absl::StrCat(
        path,
        ": not a best-checkpoint record (completed_steps, checkpoint, tau); remove it to "
        "start choosing the best checkpoint afresh"));
  }
  CheckpointPipeline::Best best;
  best.completed_steps = j["completed_steps"].get<uint64_t>();
  best.dir = (fs::path(path).parent_path() / j["checkpoint"].get<std::string>()).string();
  best.tau = j["tau"].get<double>();
  return best;
}

}  // namespace

absl::Status CheckpointPipeline::Resumed(uint64_t completed_steps, std::string dir) {
  std::optional<Best> best;
  if (options_.keep_best && fs::exists(options_.best_record)) {
    FD_ASSIGN_OR_RETURN(best, ReadBestRecord(options_.best_record));
    if (best->completed_steps > completed_steps) {
      // Resumed from an earlier checkpoint: the steps after it run again, and their checkpoints
      // (the best's included) are written anew.
      LOG(WARNING) << "the best checkpoint (" << best->dir << ") comes after the resume point; "
                   << "the best is chosen again from step " << completed_steps;
      best.reset();
      std::error_code ec;  // nor may a later resume take the record for what it named
      fs::remove(options_.best_record, ec);
    } else if (!fs::is_directory(best->dir)) {
      return absl::DataLossError(absl::StrCat(options_.best_record, " names ", best->dir,
                                              ", which is gone; remove the record to start "
                                              "choosing the best checkpoint afresh"));
    }
  }
  absl::MutexLock lock(&mu_);
  last_ = {completed_steps, std::move(dir), -1};
  best_ = std::move(best);
  return absl::OkStatus();
}

void CheckpointPipeline::Expect(const std::string& token, uint64_t completed_steps) {
  absl::MutexLock lock(&mu_);
  receiver_.Expect(token, completed_steps);
  uploader_ = token;
  uploader_gone_ = false;
}

absl::Status CheckpointPipeline::Begin(const std::string& token,
                                       const v1::CheckpointUpload& upload) {
  absl::MutexLock lock(&mu_);
  absl::Status s = receiver_.Begin(token, upload);
  if (!s.ok() && !absl::IsFailedPrecondition(s)) receiver_.Reset();  // a broken uploader
  return s;
}

absl::Status CheckpointPipeline::Add(const std::string& token, const v1::TensorChunk& chunk) {
  absl::MutexLock lock(&mu_);
  absl::Status s = receiver_.Add(token, chunk);
  if (!s.ok() && !absl::IsFailedPrecondition(s)) receiver_.Reset();
  return s;
}

void CheckpointPipeline::WorkerGone(const std::string& token) {
  absl::MutexLock lock(&mu_);
  if (token == uploader_) uploader_gone_ = true;
}

void CheckpointPipeline::Start(uint64_t completed_steps) {
  Wait();
  writer_thread_ = std::thread([this, completed_steps] {
    absl::Status taken = Take(completed_steps);
    if (absl::IsAborted(taken)) {
      LOG(WARNING) << "checkpoint skipped: " << taken.message();
    } else if (!taken.ok()) {
      on_failure_(taken);
    }
  });
}

void CheckpointPipeline::Wait() {
  if (writer_thread_.joinable()) writer_thread_.join();
}

void CheckpointPipeline::Cancel(absl::Status why) {
  absl::MutexLock lock(&mu_);
  if (cancelled_.ok()) cancelled_ = std::move(why);
}

absl::StatusOr<std::vector<OwnedTensor>> CheckpointPipeline::AwaitUpload(uint64_t completed_steps) {
  absl::MutexLock lock(&mu_);
  struct Ready {
    CheckpointPipeline* p;
    uint64_t steps;
    static bool Done(Ready* r) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return r->p->receiver_.Complete(r->steps) || r->p->uploader_gone_ || !r->p->cancelled_.ok();
    }
  } ready{this, completed_steps};
  const bool done = clock_.AwaitUntil(mu_, absl::Condition(&Ready::Done, &ready),
                                      clock_.Now() + options_.upload_timeout_seconds);
  if (!cancelled_.ok()) return cancelled_;
  if (uploader_gone_) {
    // Other membership changes do not matter: the uploader's state after a committed step is the
    // group's.
    receiver_.Reset();
    return absl::AbortedError(absl::StrCat(
        "the uploading worker left before the checkpoint of step ", completed_steps, " arrived"));
  }
  if (!done) {
    return absl::DeadlineExceededError(absl::StrCat("rank 0 did not upload the checkpoint of step ",
                                                    completed_steps, " within ",
                                                    options_.upload_timeout_seconds, " s"));
  }
  return receiver_.Take();
}

absl::Status CheckpointPipeline::Take(uint64_t completed_steps) {
  const double start = clock_.Now();
  absl::StatusOr<std::vector<OwnedTensor>> tensors = AwaitUpload(completed_steps);
  if (!tensors.ok()) return tensors.status();
  absl::StatusOr<CheckpointInfo> info = writer_(completed_steps, *tensors, numerics_(), InUse());
  if (!info.ok()) return info.status();
  const double seconds = clock_.Now() - start;
  {
    absl::MutexLock lock(&mu_);
    last_ = {completed_steps, info->dir, clock_.Now()};
    if (EvalDue(completed_steps)) evals_.emplace_back(completed_steps, info->dir);
  }
  metrics_.RecordCheckpoint(seconds, UnixSeconds());
  LOG(INFO) << absl::StrFormat("checkpoint %s written in %.2f s", info->dir, seconds);
  return absl::OkStatus();
}

bool CheckpointPipeline::EvalDue(uint64_t completed_steps) const {
  return evaluator_ && options_.eval_every_steps > 0 &&
         completed_steps % static_cast<uint64_t>(options_.eval_every_steps) == 0;
}

void CheckpointPipeline::EvalLoop() {
  while (true) {
    std::pair<uint64_t, std::string> next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CheckpointPipeline* p)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return !p->evals_.empty() || p->stopping_; },
          this));
      if (stopping_) return;
      next = evals_.front();
      evals_.pop_front();
      evaluating_ = next.second;
    }
    Evaluate(next.first, next.second);
    absl::MutexLock lock(&mu_);
    evaluating_.clear();
  }
}

void CheckpointPipeline::DrainEvaluations() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](CheckpointPipeline* p)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->evals_.empty() && p->evaluating_.empty(); },
      this));
}

void CheckpointPipeline::Evaluate(uint64_t completed_steps, const std::string& dir) {
  const double start = clock_.Now();
  absl::StatusOr<EvalSummary> eval = evaluator_(dir);
  if (!eval.ok()) {  // training goes on; the next evaluation may succeed
    LOG(WARNING) << "evaluation after step " << completed_steps
                 << " failed: " << eval.status().message();
    return;
  }
  eval->seconds = clock_.Now() - start;
  metrics_.RecordEval(*eval);
  std::vector<double> acceptance;
  for (int64_t n : eval->accepted_per_position) {
    acceptance.push_back(eval->drafts > 0 ? static_cast<double>(n) / eval->drafts : 0.0);
  }
  step_log_.WriteEvent({{"event", "eval"},
                        {"completed_steps", completed_steps},
                        {"tau", eval->tau},
                        {"tau_zlab", eval->tau_zlab},
                        {"tau_pooled", eval->tau_pooled},
                        {"tau_sglang", eval->tau_sglang},
                        {"prompts", eval->prompts},
                        {"num_drafts", eval->drafts},
                        {"num_draft_tokens", eval->draft_tokens},
                        {"num_accepted_tokens", eval->accepted_tokens},
                        {"acceptance_per_position", acceptance},
                        {"seconds", eval->seconds},
                        {"unix_time", UnixSeconds()}});
  LOG(INFO) << absl::StrFormat(
      "eval after step %d: tau %.2f on %d prompt(s) (acceptance at position 1: %.2f) in %.1f s",
      completed_steps, eval->tau, eval->prompts, acceptance.empty() ? 0.0 : acceptance[0],
      eval->seconds);
  if (options_.keep_best) ConsiderBest(completed_steps, dir, eval->tau);
}

// On the evaluation thread only: nothing else changes best_, so it holds between the two locks.
void CheckpointPipeline::ConsiderBest(uint64_t completed_steps, const std::string& dir,
                                      double tau) {
  {
    absl::MutexLock lock(&mu_);
    if (best_ && best_->tau >= tau) return;  // a tie keeps the earlier checkpoint
  }
  const Best best{completed_steps, dir, tau};
  // The record first: should it fail, the pruning still keeps the best it names.
  if (absl::Status s = WriteFileAtomically(options_.best_record, BestRecordJson(best)); !s.ok()) {
    LOG(WARNING) << "cannot record the best checkpoint: " << s.message();
    return;
  }
  absl::MutexLock lock(&mu_);
  best_ = best;
  LOG(INFO) << absl::StrFormat("best checkpoint so far: %s (tau %.3f)", dir, tau);
}

std::optional<CheckpointPipeline::Best> CheckpointPipeline::best() const {
  absl::MutexLock lock(&mu_);
  return best_;
}

std::vector<std::string> CheckpointPipeline::InUse() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> dirs;
  for (const auto& [steps, dir] : evals_) dirs.push_back(dir);
  if (!evaluating_.empty()) dirs.push_back(evaluating_);
  if (best_) dirs.push_back(best_->dir);
  return dirs;
}

CheckpointPipeline::Last CheckpointPipeline::last() const {
  absl::MutexLock lock(&mu_);
  return last_;
}

absl::Status CheckpointPipeline::ExportFinal(int64_t total_steps, const std::string& dir) const {
  // The checkpoint this process wrote (or resumed from, verified then): not read a second time.
  const Last written = last();
  if (written.completed_steps != static_cast<uint64_t>(total_steps) || written.dir.empty()) {
    return absl::DataLossError(absl::StrCat(
        "the checkpoint of the last step (", total_steps,
        ") was not written, so the drafter was not exported; `flashdraft export --checkpoint "
        "DIR --out DIR` exports the newest checkpoint there is"));
  }
  if (absl::Status s = ExportCheckpoint(written.dir, dir); !s.ok()) return s;
  LOG(INFO) << "exported the drafter to " << dir;
  return absl::OkStatus();
}

absl::Status CheckpointPipeline::ExportBest(const std::string& dir) const {
  const std::optional<Best> chosen = best();
  if (!chosen) {
    return absl::NotFoundError("no evaluation succeeded, so there is no best checkpoint to export");
  }
  if (absl::Status s = ExportCheckpoint(chosen->dir, dir); !s.ok()) return s;
  LOG(INFO) << absl::StrFormat("exported the best drafter (step %d, tau %.3f) to %s",
                               chosen->completed_steps, chosen->tau, dir);
  return absl::OkStatus();
}

}  // namespace flashdraft
