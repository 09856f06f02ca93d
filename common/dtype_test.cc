#include "common/dtype.h"

#include <gtest/gtest.h>

namespace flashdraft {
namespace {

TEST(DTypeTest, NamesAndSizesRoundTrip) {
  struct Case {
    DType dtype;
    const char* name;
    size_t size;
  };
  const Case cases[] = {{DType::kF32, "F32", 4}, {DType::kF16, "F16", 2}, {DType::kBF16, "BF16", 2},
                        {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4}, {DType::kBool, "BOOL", 1},
                        {DType::kU8, "U8", 1}};
  for (const Case& c : cases) {
    EXPECT_EQ(DTypeName(c.dtype), c.name);
    EXPECT_EQ(ElementSize(c.dtype), c.size);
    EXPECT_EQ(DTypeFromName(c.name), c.dtype);
    EXPECT_EQ(DTypeFromInt(static_cast<int>(c.dtype)), c.dtype);
  }
  EXPECT_EQ(DTypeFromName("F8_E4M3"), std::nullopt);
  EXPECT_EQ(DTypeFromInt(0), std::nullopt);
  EXPECT_EQ(DTypeFromInt(99), std::nullopt);
}

TEST(DTypeTest, ByteSizeChecksShape) {
  EXPECT_EQ(*ByteSize(DType::kBF16, {2, 3}), 12u);
  EXPECT_EQ(*ByteSize(DType::kF32, {}), 4u);  // a scalar
  EXPECT_EQ(*ByteSize(DType::kI64, {0, 5}), 0u);
  auto negative = ByteSize(DType::kF32, {2, -1});
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("negative dimension -1"), std::string::npos);
  auto huge = ByteSize(DType::kF32, {int64_t{1} << 40, int64_t{1} << 40});
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("too many elements"), std::string::npos);
}

}  // namespace
}  // namespace flashdraft
