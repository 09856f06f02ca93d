// The process's own memory high-water mark, for logs, metrics and memory estimates checked against
// what a job really took.
#pragma once

#include <sys/resource.h>

#include <cstdint>

namespace flashdraft {

// The largest resident set this process has had (getrusage's ru_maxrss; VmHWM in /proc).
inline int64_t PeakResidentBytes() {
  struct rusage usage = {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

}  // namespace flashdraft
