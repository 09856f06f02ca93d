// Checkpoints while training goes on: the commit of a checkpoint step asks the epoch's rank 0 for
// its state (Expect); its upload arrives chunk by chunk on its Train stream (Begin, Add: checked
// and copied under this pipeline's lock, never the controller's); a thread of the pipeline waits
// for the whole upload and writes the checkpoint (fsyncs off every lock); evaluations of written
// checkpoints run on a queue of their own, so a long evaluation never delays the next checkpoint.
// One checkpoint at a time: the driver Wait()s for the previous one before it commits the next.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/tensor_codec.h"
#include "coordinator/checkpoint.h"
#include "coordinator/checkpoint_upload.h"
#include "coordinator/membership_controller.h"
#include "coordinator/metrics.h"
#include "coordinator/step_log.h"

namespace flashdraft {

class CheckpointPipeline : public UploadSink {
 public:
  // Writes the checkpoint after `completed_steps` (CheckpointStore::Write; tests inject one),
  // pruning none of the checkpoint directories `in_use` (queued for or under evaluation).
  using Writer = std::function<absl::StatusOr<CheckpointInfo>(
      uint64_t completed_steps, const std::vector<OwnedTensor>& tensors,
      const std::string& numerics, const std::vector<std::string>& in_use)>;
  // Speculative decoding with a checkpoint's weights (coordinator/evaluator.h).
  using Evaluator = std::function<absl::StatusOr<EvalSummary>(const std::string& checkpoint_dir)>;
  struct Options {
    double upload_timeout_seconds = 300;  // cluster.collective_timeout_seconds
    int eval_every_steps = 0;             // eval.every_steps (0: none)
    // checkpoint.keep_best: the evaluated checkpoint with the highest τ is never pruned; it is
    // recorded in `best_record` (JSON, replaced atomically), which a resumed job reads back.
    bool keep_best = false;
    std::string best_record;
  };
  // The evaluated checkpoint with the highest τ so far (keep_best).
  struct Best {
    uint64_t completed_steps = 0;
    std::string dir;
    double tau = 0;
  };
  // The last checkpoint written, or resumed from (`at` < 0: its age is not known).
  struct Last {
    uint64_t completed_steps = 0;
    std::string dir;
    double at = -1;
  };

  // `upload`: the tensors an upload holds (CheckpointUploadSpecs). `numerics` gives the
  // checkpoint.json's numerics record when a checkpoint is written; `on_failure` is told when a
  // checkpoint cannot be written (the job fails).
  CheckpointPipeline(Options options, std::vector<TensorSpec> upload, Writer writer,
                     std::function<std::string()> numerics,
                     std::function<void(absl::Status)> on_failure, CoordinatorMetrics& metrics,
                     StepLog& step_log, const Clock& clock);
  // Stops the evaluation queue (after the evaluation under way) and joins the threads.
  ~CheckpointPipeline() override;

  void SetEvaluator(Evaluator evaluator) { evaluator_ = std::move(evaluator); }
  // The job resumed from the checkpoint after `completed_steps` in `dir`; with keep_best, the best
  // checkpoint is read back from the record (an unreadable record, or one naming a checkpoint that
  // is gone, is an error).
  absl::Status Resumed(uint64_t completed_steps, std::string dir);

  // UploadSink.
  void Expect(const std::string& token, uint64_t completed_steps) override;
  absl::Status Begin(const std::string& token, const v1::CheckpointUpload& upload) override;
  absl::Status Add(const std::string& token, const v1::TensorChunk& chunk) override;
  void WorkerGone(const std::string& token) override;

  // Takes the checkpoint after `completed_steps` (the upload Expect()ed) on the pipeline's thread.
  void Start(uint64_t completed_steps);
  // Waits for the checkpoint under way, if any.
  void Wait();
  // The checkpoint under way gives up with `why` (the job failed).
  void Cancel(absl::Status why);
  // eval.every_steps divides `completed_steps` and an evaluator is set.
  bool EvalDue(uint64_t completed_steps) const;
  // Waits until the queued evaluations are done.
  void DrainEvaluations();
  Last last() const;
  // <dir> from the checkpoint of the last step (`total_steps`): DATA_LOSS when it was not written.
  absl::Status ExportFinal(int64_t total_steps, const std::string& dir) const;
  // keep_best: <dir> from the best evaluated checkpoint (after DrainEvaluations); NOT_FOUND when
  // no evaluation succeeded.
  absl::Status ExportBest(const std::string& dir) const;
  std::optional<Best> best() const;

 private:
  absl::Status Take(uint64_t completed_steps);
  // Waits for the whole upload; its tensors, or why not.
  absl::StatusOr<std::vector<OwnedTensor>> AwaitUpload(uint64_t completed_steps);
  void EvalLoop();
  void Evaluate(uint64_t completed_steps, const std::string& dir);
  // keep_best: `dir`, evaluated at `tau`, becomes the best when it beats the one before.
  void ConsiderBest(uint64_t completed_steps, const std::string& dir, double tau);
  // The checkpoint directories an evaluation still needs.
  std::vector<std::string> InUse() const;

  const Options options_;
  const Writer writer_;
  const std::function<std::string()> numerics_;
  const std::function<void(absl::Status)> on_failure_;
  CoordinatorMetrics& metrics_;
  StepLog& step_log_;
  const Clock& clock_;
  Evaluator evaluator_;        // set before the job starts
  std::thread writer_thread_;  // the checkpoint under way (the driver's thread starts and joins it)

  mutable absl::Mutex mu_;
  UploadReceiver receiver_ ABSL_GUARDED_BY(mu_);
  std::string uploader_ ABSL_GUARDED_BY(mu_);  // who the expected upload comes from
  bool uploader_gone_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
  Last last_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<uint64_t, std::string>> evals_ ABSL_GUARDED_BY(mu_);  // step, dir
  std::string evaluating_ ABSL_GUARDED_BY(mu_);  // the directory under evaluation (empty: none)
  std::optional<Best> best_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread eval_thread_;  // last: starts once the fields it reads are built
};

}  // namespace flashdraft
