// A blocking FIFO between threads, optionally bounded, that can be closed: after Close(), Push
// drops items and Pop returns what is left, then nullopt. Used where one thread receives and
// another consumes (the worker's stream reader, decoder and training threads).
#pragma once

#include <cstddef>
#include <deque>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace flashdraft {

template <typename T>
class BlockingQueue {
 public:
  // capacity 0: unbounded.
  explicit BlockingQueue(size_t capacity = 0) : capacity_(capacity) {}

  // Waits while the queue is full; returns false (dropping `item`) once the queue is closed.
  bool Push(T item) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_, absl::Condition(this, &BlockingQueue::HasRoomOrClosed));
    if (closed_) return false;
    items_.push_back(std::move(item));
    return true;
  }

  // Waits for an item; nullopt when the queue is closed and drained.
  std::optional<T> Pop() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_, absl::Condition(this, &BlockingQueue::HasItemOrClosed));
    if (items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    return item;
  }

  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

 private:
  // Conditions of the waits: absl::Mutex evaluates them under mu_ whenever it is released.
  bool HasRoomOrClosed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || capacity_ == 0 || items_.size() < capacity_;
  }
  bool HasItemOrClosed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !items_.empty();
  }

  const size_t capacity_;
  absl::Mutex mu_;
  std::deque<T> items_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace flashdraft
