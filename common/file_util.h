// Whole-file reads and crash-safe writes.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flashdraft {

absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `contents` to a temporary file beside `path`, fsyncs it, renames it over `path` and fsyncs
// the directory: afterwards the file is either the old one or the whole new one.
// `written` (if set) is told the bytes written so far, every 16 MiB.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 const std::function<void(size_t written)>& written = nullptr);
// The same with the contents in pieces, written one after another (no copy into one buffer).
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::vector<absl::string_view>& pieces,
                                 const std::function<void(size_t written)>& written = nullptr);

}  // namespace flashdraft
