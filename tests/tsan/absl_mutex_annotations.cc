// ThreadSanitizer annotations for Debian's uninstrumented absl::Mutex (linked into every executable
// of a -DFLASHDRAFT_TSAN=ON build, nowhere else).
//
// Debian's libabsl_synchronization is built without TSan, so its ABSL_TSAN_MUTEX_* annotations are
// empty and TSan sees neither the lock nor the unlock: every field an absl::Mutex guards would be
// reported as a race. This file defines, in the executable, the exported Mutex/CondVar entry points
// that take or release the lock; the executable's definitions interpose on the library's (they are
// in its dynamic symbol table), for our code and for gRPC's and the library's own calls through the
// PLT alike. Each adds the annotations abseil's own TSan build makes and calls the library's
// implementation, found with dlsym(RTLD_NEXT).
//
// Exactly one annotation per lock and unlock: the set was chosen from `objdump -d` of
// libabsl_synchronization.so.20220623 (which entry points call which through the PLT):
//   - Lock, Unlock, ReaderLock, ReaderUnlock, TryLock, ReaderTryLock: leaves (they go to LockSlow /
//     UnlockSlow, not overridden).
//   - LockWhen, ReaderLockWhen, LockWhenWithDeadline, ReaderLockWhenWithDeadline: leaves too (they
//     go to LockSlow / LockSlowWithDeadline). The *WithTimeout forms are NOT overridden: they
//     tail-call the *WithDeadline forms through the PLT, so overriding both annotated twice.
//   - Await, AwaitWithTimeout, AwaitWithDeadline all reach the private AwaitCommon through the PLT,
//     and CondVar::Wait, WaitWithTimeout, WaitWithDeadline reach CondVar::WaitCommon: only the two
//     *Common functions are overridden. They release and retake the lock inside (UnlockSlow,
//     LockSlowLoop / Trans), which is annotated as an unlock before and a lock after.
//   - Barrier and ReleasableMutexLock::Release call Lock, Unlock and Await through the PLT:
//   covered.
//   - Notification also locks through the PLT, but WaitForNotification* return at once, without
//     the lock, once the flag is set, and the inline HasBeenNotified() only loads the flag: that
//     handoff is an atomic store in uninstrumented code. Notify is annotated as a release of the
//     flag's address and the waits as an acquire (the inline load acquires it by itself).
//   - BlockingCounter (unused here) hands off through an uninstrumented atomic counter and is not
//     covered: add DecrementCount/Wait here before using it.
//   - ~Mutex is not overridden: TSan drops a mutex's state when its heap memory is freed; a stale
//     state at a reused stack address could only hide a race, never report one.
// Condition predicates that absl evaluates for another thread run between a pre and a post
// annotation, where TSan ignores memory accesses, as in abseil's own TSan build.
//
// The mangled names below are abseil 20220623's with Debian's inline namespace `debian3`; another
// abseil fails the static_assert (a new version: redo the objdump check above).
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

#define FLASHDRAFT_TSAN_STR2(x) #x
#define FLASHDRAFT_TSAN_STR(x) FLASHDRAFT_TSAN_STR2(x)
static_assert(std::string_view(FLASHDRAFT_TSAN_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME)) == "debian3",
              "tests/tsan/absl_mutex_annotations.cc matches Debian's abseil 20220623 only");

namespace {

// The library's implementation of `mangled` (a member function: `this` is the first argument).
template <typename Fn>
Fn Real(const char* mangled) {
  void* fn = dlsym(RTLD_NEXT, mangled);
  if (fn == nullptr) {
    std::fprintf(stderr, "absl_mutex_annotations: %s not found in libabsl_synchronization\n",
                 mangled);
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

// abseil's kMuWriter bit of Mutex::mu_ (mutex.cc): set while the mutex is held exclusively.
constexpr intptr_t kMuWriter = 0x0008;

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex4LockEv");
  __tsan_mutex_pre_lock(this, 0);
  real(this);
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::ReaderLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex10ReaderLockEv");
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  real(this);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
}

void Mutex::Unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex6UnlockEv");
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderUnlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex12ReaderUnlockEv");
  __tsan_mutex_pre_unlock(this, __tsan_mutex_read_lock);
  real(this);
  __tsan_mutex_post_unlock(this, __tsan_mutex_read_lock);
}

bool Mutex::TryLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<bool (*)(Mutex*)>("_ZN4absl7debian35Mutex7TryLockEv");
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  const bool locked = real(this);
  __tsan_mutex_post_lock(
      this, locked ? __tsan_mutex_try_lock : __tsan_mutex_try_lock | __tsan_mutex_try_lock_failed,
      0);
  return locked;
}

bool Mutex::ReaderTryLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<bool (*)(Mutex*)>("_ZN4absl7debian35Mutex13ReaderTryLockEv");
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_read_lock);
  const bool locked = real(this);
  __tsan_mutex_post_lock(
      this, locked ? __tsan_mutex_try_read_lock : __tsan_mutex_try_read_lock_failed, 0);
  return locked;
}

// The *LockWhen* forms always return holding the lock (the result says whether `cond` holds).
void Mutex::LockWhen(const Condition& cond) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>("_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  __tsan_mutex_pre_lock(this, 0);
  real(this, cond);
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::ReaderLockWhen(const Condition& cond) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<void (*)(Mutex*, const Condition&)>(
      "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  real(this, cond);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
}

bool Mutex::LockWhenWithDeadline(const Condition& cond,
                                 absl::Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_mutex_pre_lock(this, 0);
  const bool result = real(this, cond, deadline);
  __tsan_mutex_post_lock(this, 0, 0);
  return result;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond,
                                       absl::Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  const bool result = real(this, cond, deadline);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
  return result;
}

// Entered and left holding the lock (in the mode it is held); released while waiting.
bool Mutex::AwaitCommon(const Condition& cond,
                        synchronization_internal::KernelTimeout t) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real =
      Real<bool (*)(Mutex*, const Condition&, synchronization_internal::KernelTimeout)>(
          "_ZN4absl7debian35Mutex11AwaitCommonERKNS0_9ConditionENS0_24synchronization_"
          "internal13KernelTimeoutE");
  const unsigned how =
      (mu_.load(std::memory_order_relaxed) & kMuWriter) != 0 ? 0 : __tsan_mutex_read_lock;
  __tsan_mutex_pre_unlock(this, how);
  __tsan_mutex_post_unlock(this, how);
  __tsan_mutex_pre_lock(this, how);
  const bool result = real(this, cond, t);
  __tsan_mutex_post_lock(this, how, 0);
  return result;
}

bool CondVar::WaitCommon(Mutex* mutex,
                         synchronization_internal::KernelTimeout t) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real =
      Real<bool (*)(CondVar*, Mutex*, synchronization_internal::KernelTimeout)>(
          "_ZN4absl7debian37CondVar10WaitCommonEPNS0_5MutexENS0_24synchronization_"
          "internal13KernelTimeoutE");
  const unsigned how =
      (mutex->mu_.load(std::memory_order_relaxed) & kMuWriter) != 0 ? 0 : __tsan_mutex_read_lock;
  __tsan_mutex_pre_unlock(mutex, how);
  __tsan_mutex_post_unlock(mutex, how);
  __tsan_mutex_pre_lock(mutex, how);
  const bool result = real(this, mutex, t);
  __tsan_mutex_post_lock(mutex, how, 0);
  return result;
}

void Notification::Notify() {
  static const auto real = Real<void (*)(Notification*)>("_ZN4absl7debian312Notification6NotifyEv");
  __tsan_release(&notified_yet_);
  real(this);
}

void Notification::WaitForNotification() const {
  static const auto real =
      Real<void (*)(const Notification*)>("_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<std::atomic<bool>*>(&notified_yet_));
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  static const auto real = Real<bool (*)(const Notification*, absl::Duration)>(
      "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(const_cast<std::atomic<bool>*>(&notified_yet_));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  static const auto real = Real<bool (*)(const Notification*, absl::Time)>(
      "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(const_cast<std::atomic<bool>*>(&notified_yet_));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
