#include "coordinator/latest_file_writer.h"

#include <utility>

#include "common/file_util.h"
#include "glog/logging.h"

namespace flashdraft {

LatestFileWriter::LatestFileWriter(std::string path, WriteFn write)
    : path_(std::move(path)),
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

void LatestFileWriter::Loop() {
  while (true) {
    std::string content;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](LatestFileWriter* w)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->pending_.has_value() || w->stopping_; },
          this));
      if (!pending_.has_value()) return;  // stopping, nothing left
      content = *std::move(pending_);
      pending_.reset();
      writing_ = true;
    }
    if (absl::Status s = write_(path_, content); !s.ok()) {
      LOG(WARNING) << "cannot update " << path_ << ": " << s.message();
    }
    absl::MutexLock lock(&mu_);
    writing_ = false;
  }
}

}  // namespace flashdraft
