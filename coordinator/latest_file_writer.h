// Keeps a file at the newest content posted, written on a thread of its own so that the one who
// posts never waits on the disk (the coordinator's reactions post Prometheus's targets.json under
// their lock). Contents posted while a write is under way collapse into the newest.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace flashdraft {

class LatestFileWriter {
 public:
  // Writes `content` to `path` (tests inject one that blocks).
  using WriteFn = std::function<absl::Status(const std::string& path, const std::string& content)>;
  // `write` defaults to WriteFileAtomically (common/file_util.h).
  explicit LatestFileWriter(std::string path, WriteFn write = {});
  // Writes what is still pending, then stops.
  ~LatestFileWriter();

  // Never blocks.
  void Post(std::string content);
  // Waits until everything posted so far is written (or failed; logged).
  void Flush();

 private:
  void Loop();

  const std::string path_;
  const WriteFn write_;
  absl::Mutex mu_;
  std::optional<std::string> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the fields it reads
};

}  // namespace flashdraft
