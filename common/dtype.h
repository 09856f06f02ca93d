// Element types shared by the safetensors files and the wire codec. The numeric values equal the
// proto enum flashdraft.v1.DType (checked where both are visible).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace flashdraft {

enum class DType : int {
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kI64 = 4,
  kI32 = 5,
  kBool = 6,
  kU8 = 7,
};

size_t ElementSize(DType dtype);
// The safetensors spelling: "F32", "BF16", "BOOL", ...
absl::string_view DTypeName(DType dtype);
std::optional<DType> DTypeFromName(absl::string_view name);
// Accepts only the values above; anything else (a corrupt or newer peer) is nullopt.
std::optional<DType> DTypeFromInt(int value);

// Number of elements of `shape`; an error for negative dimensions or overflow past 2^56 elements.
absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape);
// Bytes of a dense tensor of `shape` and `dtype`, with the same checks.
absl::StatusOr<uint64_t> ByteSize(DType dtype, absl::Span<const int64_t> shape);

// "[2, 3, 4]" for error messages.
std::string ShapeString(absl::Span<const int64_t> shape);

}  // namespace flashdraft
