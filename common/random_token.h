// Unguessable identifiers: session tokens, feeder tickets. 128 bits from std::random_device
// (the kernel's random source on Linux), as 32 hex digits.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "absl/strings/str_format.h"

namespace flashdraft {

inline std::string RandomToken() {
  std::random_device rd;
  return absl::StrFormat("%016x%016x", (uint64_t{rd()} << 32) | rd(),
                         (uint64_t{rd()} << 32) | rd());
}

}  // namespace flashdraft
