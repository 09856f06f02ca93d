#include "coordinator/checkpoint_pipeline.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "glog/logging.h"
#include "model/drafter_export.h"

namespace flashdraft {

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

void CheckpointPipeline::Resumed(uint64_t completed_steps, std::string dir) {
  absl::MutexLock lock(&mu_);
  last_ = {completed_steps, std::move(dir), -1};
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
}

std::vector<std::string> CheckpointPipeline::InUse() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> dirs;
  for (const auto& [steps, dir] : evals_) dirs.push_back(dir);
  if (!evaluating_.empty()) dirs.push_back(evaluating_);
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

}  // namespace flashdraft
