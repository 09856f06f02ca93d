#include "common/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::RandomBytes;

TEST(Crc32cTest, KnownVectors) {
  // RFC 3720 B.4 and the usual check value.
  struct Case {
    std::vector<uint8_t> data;
    uint32_t crc;
  };
  std::vector<uint8_t> ascending(32), descending(32);
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<uint8_t>(i);
    descending[i] = static_cast<uint8_t>(31 - i);
  }
  const std::string check = "123456789";
  const Case cases[] = {
      {std::vector<uint8_t>(check.begin(), check.end()), 0xE3069283u},
      {std::vector<uint8_t>(32, 0x00), 0x8A9136AAu},
      {std::vector<uint8_t>(32, 0xFF), 0x62A8AB43u},
      {ascending, 0x46DD794Eu},
      {descending, 0x113FDB5Cu},
      {{}, 0u},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Crc32c(c.data.data(), c.data.size()), c.crc);
    EXPECT_EQ(Crc32cExtendPortable(0, c.data.data(), c.data.size()), c.crc);
  }
}

TEST(Crc32cTest, AcceleratedMatchesPortableAcrossLengthsAndAlignments) {
  const std::vector<uint8_t> data = RandomBytes(3 * 8192 * 2 + 3 * 256 * 3 + 77, 1);
  const size_t lengths[] = {0,
                            1,
                            7,
                            8,
                            9,
                            255,
                            256,
                            767,
                            768,
                            769,
                            3 * 8192 - 1,
                            3 * 8192,
                            3 * 8192 + 1,
                            2 * 3 * 8192 + 3 * 256 + 13};
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t len : lengths) {
      if (offset + len > data.size()) continue;
      SCOPED_TRACE(::testing::Message() << "offset " << offset << " len " << len);
      EXPECT_EQ(Crc32c(data.data() + offset, len),
                Crc32cExtendPortable(0, data.data() + offset, len));
    }
  }
}

TEST(Crc32cTest, ExtendComposes) {
  const std::vector<uint8_t> data = RandomBytes(100000, 2);
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t split : {size_t{0}, size_t{1}, size_t{4096}, size_t{33333}, data.size()}) {
    uint32_t crc = Crc32c(data.data(), split);
    crc = Crc32cExtend(crc, data.data() + split, data.size() - split);
    EXPECT_EQ(crc, whole) << "split " << split;
  }
}

TEST(Crc32cTest, CopyCopiesAndChecksums) {
  const std::vector<uint8_t> data = RandomBytes(3 * 8192 * 3 + 1001, 3);
  for (size_t offset : {0, 1, 5}) {
    std::vector<uint8_t> dst(data.size(), 0);
    const size_t len = data.size() - offset;
    const uint32_t crc = Crc32cCopy(0, dst.data() + offset, data.data() + offset, len);
    EXPECT_EQ(crc, Crc32c(data.data() + offset, len));
    EXPECT_TRUE(std::equal(data.begin() + offset, data.end(), dst.begin() + offset));
  }
}

TEST(Crc32cTest, DetectsSingleBitFlips) {
  std::vector<uint8_t> data = RandomBytes(4096, 4);
  const uint32_t crc = Crc32c(data.data(), data.size());
  for (size_t bit = 0; bit < data.size() * 8; bit += 997) {
    data[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_NE(Crc32c(data.data(), data.size()), crc);
    data[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
}

}  // namespace
}  // namespace flashdraft
