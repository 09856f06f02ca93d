// Keeps a file at the newest content posted, written on a thread of its own so that the one who
// posts never waits on the disk (the coordinator's reactions post Prometheus's targets.json under
// their lock). Contents posted while a write is under way collapse into the newest. A write that
// fails is tried again after a back-off on the Clock (1 s, doubling up to 30 s) until it succeeds
// or newer content replaces it, so a full disk or a moment without permissions heals by itself.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace flashdraft {

class LatestFileWriter {
 public:
  // Writes `content` to `path` (tests inject one that blocks or fails).
  using WriteFn = std::function<absl::Status(const std::string& path, const std::string& content)>;
  static constexpr double kFirstRetrySeconds = 1;
  static constexpr double kMaxRetrySeconds = 30;

  // `write` defaults to WriteFileAtomically (common/file_util.h).
  LatestFileWriter(std::string path, const Clock& clock, WriteFn write = {});
  // Writes what is still posted, then stops (a failed content waiting for its retry is dropped).
  ~LatestFileWriter();

  // Never blocks.
  void Post(std::string content);
  // Waits until everything posted so far was written or failed once (a failed one is retried
  // later).
  void Flush();

 private:
  void Loop();
  // Waits for content to write: newly posted, or a failed one whose retry is due. None: stopping.
  std::optional<std::string> Next() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Written(const absl::Status& status, std::string content) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const Clock& clock_;
  const WriteFn write_;
  absl::Mutex mu_;
  std::optional<std::string> pending_ ABSL_GUARDED_BY(mu_);  // posted, not written yet
  std::optional<std::string> failed_ ABSL_GUARDED_BY(mu_);   // the last write of it failed
  double retry_at_ ABSL_GUARDED_BY(mu_) = 0;
  double backoff_ ABSL_GUARDED_BY(mu_) = kFirstRetrySeconds;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the fields it reads
};

}  // namespace flashdraft
