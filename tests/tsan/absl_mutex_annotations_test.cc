// Every absl::Mutex / CondVar / Notification path our code and gRPC use hands a plain int from one
// thread to another. Under TSan (tests/tsan/absl_mutex_annotations.cc) a path that is not annotated
// is reported as a data race and one annotated twice as a mutex misuse; the process then exits 66.
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace {

constexpr absl::Duration kLong = absl::Seconds(30);

TEST(AbslMutexAnnotations, LockAndUnlock) {
  absl::Mutex mu;
  int counter = 0;  // guarded by mu
  auto add = [&] {
    for (int i = 0; i < 1000; ++i) {
      absl::MutexLock lock(&mu);
      ++counter;
    }
  };
  std::thread other(add);
  add();
  other.join();
  EXPECT_EQ(counter, 2000);
}

TEST(AbslMutexAnnotations, ReaderLockSeesWriterLock) {
  absl::Mutex mu;
  int value = 0;
  bool written = false;
  std::thread writer([&] {
    absl::MutexLock lock(&mu);
    value = 7;
    written = true;
  });
  for (;;) {
    absl::ReaderMutexLock lock(&mu);
    if (written) {
      EXPECT_EQ(value, 7);
      break;
    }
  }
  writer.join();
}

TEST(AbslMutexAnnotations, TryLock) {
  absl::Mutex mu;
  int value = 0;
  bool written = false;
  std::thread writer([&] {
    while (!mu.TryLock()) {
    }
    value = 1;
    written = true;
    mu.Unlock();
  });
  for (bool done = false; !done;) {
    if (mu.ReaderTryLock()) {
      done = written;
      if (done) {
        EXPECT_EQ(value, 1);
      }
      mu.ReaderUnlock();
    }
  }
  writer.join();
}

TEST(AbslMutexAnnotations, LockWhenAndTimeouts) {
  absl::Mutex mu;
  int value = 0;
  bool ready = false;
  std::thread writer([&] {
    absl::MutexLock lock(&mu);
    value = 3;
    ready = true;
  });
  mu.LockWhen(absl::Condition(&ready));
  EXPECT_EQ(value, 3);
  mu.Unlock();
  // LockWhenWithTimeout goes through the overridden LockWhenWithDeadline.
  EXPECT_TRUE(mu.LockWhenWithTimeout(absl::Condition(&ready), kLong));
  value = 4;
  mu.Unlock();
  EXPECT_TRUE(mu.ReaderLockWhenWithTimeout(absl::Condition(&ready), kLong));
  EXPECT_EQ(value, 4);
  mu.ReaderUnlock();
  mu.ReaderLockWhen(absl::Condition(&ready));
  mu.ReaderUnlock();
  writer.join();
}

TEST(AbslMutexAnnotations, Await) {
  absl::Mutex mu;
  int value = 0;
  int stage = 0;
  std::thread writer([&] {
    absl::MutexLock lock(&mu);
    value = 5;
    stage = 1;
    mu.Await(absl::Condition(
        +[](int* s) { return *s == 2; }, &stage));
    EXPECT_EQ(value, 6);
  });
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(
                                        +[](int* s) { return *s == 1; }, &stage),
                                    kLong));
    EXPECT_EQ(value, 5);
    value = 6;
    stage = 2;
  }
  writer.join();
  // A timeout that expires: the lock is still released and retaken exactly once.
  absl::MutexLock lock(&mu);
  EXPECT_FALSE(mu.AwaitWithTimeout(absl::Condition(
                                       +[](int* s) { return *s == 9; }, &stage),
                                   absl::Milliseconds(1)));
}

TEST(AbslMutexAnnotations, CondVar) {
  absl::Mutex mu;
  absl::CondVar cv;
  int value = 0;
  bool ready = false;
  std::thread writer([&] {
    absl::MutexLock lock(&mu);
    value = 8;
    ready = true;
    cv.Signal();
  });
  {
    absl::MutexLock lock(&mu);
    while (!ready) cv.Wait(&mu);
    EXPECT_EQ(value, 8);
    value = 9;
    EXPECT_TRUE(cv.WaitWithTimeout(&mu, absl::Milliseconds(1)));  // times out
  }
  writer.join();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(value, 9);
}

TEST(AbslMutexAnnotations, Notification) {
  int value = 0;
  absl::Notification done;
  std::thread writer([&] {
    value = 10;
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_EQ(value, 10);
  writer.join();

  // Notified before the wait (the lock-free fast path), and the inline HasBeenNotified().
  absl::Notification early;
  std::thread early_writer([&] {
    value = 11;
    early.Notify();
  });
  while (!early.HasBeenNotified()) {
  }
  EXPECT_EQ(value, 11);
  EXPECT_TRUE(early.WaitForNotificationWithTimeout(kLong));
  EXPECT_EQ(value, 11);
  early_writer.join();

  absl::Notification late;
  std::thread late_writer([&] {
    absl::SleepFor(absl::Milliseconds(20));
    value = 12;
    late.Notify();
  });
  EXPECT_TRUE(late.WaitForNotificationWithTimeout(kLong));
  EXPECT_EQ(value, 12);
  late_writer.join();
}

}  // namespace
