// LatestFileWriter on a FakeClock: posts never wait, contents collapse into the newest, and a
// failed write is tried again after its back-off unless newer content replaces it.
#include "coordinator/latest_file_writer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

// A disk that fails the next `failures` writes; records every attempt.
class FlakyDisk {
 public:
  LatestFileWriter::WriteFn Fn() {
    return [this](const std::string&, const std::string& content) {
      absl::MutexLock lock(&mu_);
      attempts_.push_back(content);
      if (failures_ > 0) {
        --failures_;
        return absl::ResourceExhaustedError("No space left on device");
      }
      written_ = content;
      return absl::OkStatus();
    };
  }
  void Fail(int n) {
    absl::MutexLock lock(&mu_);
    failures_ = n;
  }
  // Waits (up to 30 s of real time) until `n` writes were attempted.
  bool AwaitAttempts(size_t n) {
    absl::MutexLock lock(&mu_);
    struct Count {
      FlakyDisk* d;
      size_t n;
      static bool Reached(Count* c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return c->d->attempts_.size() >= c->n;
      }
    } count{this, n};
    return mu_.AwaitWithTimeout(absl::Condition(&Count::Reached, &count), absl::Seconds(30));
  }
  std::vector<std::string> attempts() {
    absl::MutexLock lock(&mu_);
    return attempts_;
  }
  std::string written() {
    absl::MutexLock lock(&mu_);
    return written_;
  }

 private:
  absl::Mutex mu_;
  int failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> attempts_ ABSL_GUARDED_BY(mu_);
  std::string written_ ABSL_GUARDED_BY(mu_);
};

// Waits (up to 30 s of real time) until the writer's thread waits on the clock for its next
// content or retry.
bool AwaitParked(const FakeClock& clock) {
  return testing::Eventually([&] { return clock.waiting() > 0; });
}

TEST(LatestFileWriterTest, WritesThePostedContent) {
  FakeClock clock;
  FlakyDisk disk;
  LatestFileWriter writer("targets.json", clock, disk.Fn());
  writer.Post("one");
  writer.Flush();
  EXPECT_EQ(disk.written(), "one");
  writer.Post("two");
  writer.Flush();
  EXPECT_EQ(disk.attempts(), (std::vector<std::string>{"one", "two"}));
}

TEST(LatestFileWriterTest, RetriesAFailedWriteWithABackOffOnTheClock) {
  FakeClock clock;
  FlakyDisk disk;
  disk.Fail(2);
  LatestFileWriter writer("targets.json", clock, disk.Fn());
  writer.Post("targets");
  writer.Flush();  // the first try failed
  ASSERT_TRUE(AwaitParked(clock));
  clock.Advance(0.5);  // the first retry is due after 1 s
  ASSERT_TRUE(AwaitParked(clock));
  EXPECT_EQ(disk.attempts().size(), 1u);
  clock.Advance(0.5);
  ASSERT_TRUE(disk.AwaitAttempts(2));  // failed again: the next is due 2 s later
  ASSERT_TRUE(AwaitParked(clock));
  clock.Advance(1.5);
  ASSERT_TRUE(AwaitParked(clock));
  EXPECT_EQ(disk.attempts().size(), 2u);
  clock.Advance(0.5);
  ASSERT_TRUE(disk.AwaitAttempts(3));
  writer.Flush();
  EXPECT_EQ(disk.written(), "targets");
  EXPECT_EQ(disk.attempts(), (std::vector<std::string>{"targets", "targets", "targets"}));
}

TEST(LatestFileWriterTest, NewerContentReplacesAFailedOneAtOnce) {
  FakeClock clock;
  FlakyDisk disk;
  disk.Fail(1);
  LatestFileWriter writer("targets.json", clock, disk.Fn());
  writer.Post("old");
  writer.Flush();
  writer.Post("new");  // written without waiting for the old one's retry
  writer.Flush();
  EXPECT_EQ(disk.written(), "new");
  ASSERT_TRUE(AwaitParked(clock));
  clock.Advance(100);  // the old content is never written after the new
  ASSERT_TRUE(AwaitParked(clock));
  writer.Post("newest");
  writer.Flush();
  EXPECT_EQ(disk.attempts(), (std::vector<std::string>{"old", "new", "newest"}));
}

TEST(LatestFileWriterTest, StopsWithoutWaitingForARetry) {
  FakeClock clock;
  FlakyDisk disk;
  disk.Fail(100);
  {
    LatestFileWriter writer("targets.json", clock, disk.Fn());
    writer.Post("targets");
    writer.Flush();
  }  // the destructor returns although the retry is due only on the fake clock
  EXPECT_EQ(disk.attempts().size(), 1u);
}

}  // namespace
}  // namespace flashdraft
