#include "common/dtype.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flashdraft {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2}, {DType::kBF16, "BF16", 2},
    {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4}, {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
};

const DTypeInfo* Find(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

}  // namespace

size_t ElementSize(DType dtype) {
  const DTypeInfo* info = Find(dtype);
  return info == nullptr ? 0 : info->size;
}

absl::string_view DTypeName(DType dtype) {
  const DTypeInfo* info = Find(dtype);
  return info == nullptr ? absl::string_view("INVALID") : info->name;
}

std::optional<DType> DTypeFromName(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

std::optional<DType> DTypeFromInt(int value) {
  for (const DTypeInfo& info : kDTypes) {
    if (static_cast<int>(info.dtype) == value) return info.dtype;
  }
  return std::nullopt;
}

absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape) {
  constexpr int64_t kLimit = int64_t{1} << 56;  // keeps bytes = elements * 8 far from overflow
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension ", d, " in shape ", ShapeString(shape)));
    }
    if (d != 0 && n > kLimit / d) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has too many elements"));
    }
    n *= d;
  }
  return n;
}

absl::StatusOr<uint64_t> ByteSize(DType dtype, absl::Span<const int64_t> shape) {
  const size_t element = ElementSize(dtype);
  if (element == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
  absl::StatusOr<int64_t> n = NumElements(shape);
  if (!n.ok()) return n.status();
  return static_cast<uint64_t>(*n) * element;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace flashdraft
