#include "coordinator/latest_file_writer.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "common/file_util.h"
#include "glog/logging.h"

namespace flashdraft {

LatestFileWriter::LatestFileWriter(std::string path, const Clock& clock, WriteFn write)
    : path_(std::move(path)),
      clock_(clock),
      write_(write ? std::move(write) : WriteFn([](const std::string& p, const std::string& c) {
        return WriteFileAtomically(p, absl::string_view(c));
      })),
      thread_([this] { Loop(); }) {}

LatestFileWriter::~LatestFileWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void LatestFileWriter::Post(std::string content) {
  absl::MutexLock lock(&mu_);
  pending_ = std::move(content);
}

void LatestFileWriter::Flush() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](LatestFileWriter* w)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return !w->pending_.has_value() && !w->writing_; },
      this));
}

std::optional<std::string> LatestFileWriter::Next() {
  const double retry = failed_ ? retry_at_ : std::numeric_limits<double>::infinity();
  clock_.AwaitUntil(mu_,
                    absl::Condition(
                        +[](LatestFileWriter* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                          return w->pending_.has_value() || w->stopping_;
                        },
                        this),
                    retry);
  std::optional<std::string> next;
  if (pending_) {  // newer than any failed content
    next.swap(pending_);
    failed_.reset();
  } else if (!stopping_ && failed_ && clock_.Now() >= retry_at_) {
    next.swap(failed_);
  }
  return next;
}

void LatestFileWriter::Written(const absl::Status& status, std::string content) {
  writing_ = false;
  if (status.ok()) {
    backoff_ = kFirstRetrySeconds;
    return;
  }
  LOG(WARNING) << "cannot update " << path_ << ": " << status.message() << " (trying again in "
               << backoff_ << " s)";
  if (pending_) return;  // newer content replaces it
  failed_ = std::move(content);
  retry_at_ = clock_.Now() + backoff_;
  backoff_ = std::min(2 * backoff_, kMaxRetrySeconds);
}

void LatestFileWriter::Loop() {
  mu_.Lock();
  while (true) {
    std::optional<std::string> content = Next();
    if (!content) {
      if (stopping_ && !pending_) break;
      continue;  // the wait ended before a retry was due
    }
    writing_ = true;
    mu_.Unlock();  // the disk is waited on off the lock: Post never blocks
    const absl::Status status = write_(path_, *content);
    mu_.Lock();
    Written(status, *std::move(content));
  }
  mu_.Unlock();
}

}  // namespace flashdraft
