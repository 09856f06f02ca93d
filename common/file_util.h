// Whole-file reads and crash-safe writes.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flashdraft {

absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `contents` to a temporary file beside `path`, fsyncs it, renames it over `path` and fsyncs
// the directory: afterwards the file is either the old one or the whole new one.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace flashdraft
