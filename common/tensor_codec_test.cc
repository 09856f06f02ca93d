#include "common/tensor_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "flashdraft/v1/tensor.pb.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

using ::flashdraft::testing::RandomBytes;

std::vector<v1::TensorChunk> Encode(const TensorSpec& spec, const std::vector<uint8_t>& bytes,
                                    size_t max_chunk) {
  std::vector<v1::TensorChunk> chunks;
  absl::Status s = AppendTensorChunks(spec, bytes.data(), bytes.size(), max_chunk, [&] {
    chunks.emplace_back();
    return &chunks.back();
  });
  EXPECT_TRUE(s.ok()) << s;
  return chunks;
}

std::vector<const v1::TensorChunk*> Pointers(const std::vector<v1::TensorChunk>& chunks) {
  std::vector<const v1::TensorChunk*> out;
  for (const auto& c : chunks) out.push_back(&c);
  return out;
}

TEST(TensorCodecTest, RoundTripsAcrossChunkSizes) {
  struct Case {
    TensorSpec spec;
    size_t max_chunk;
    size_t expected_chunks;
  };
  const Case cases[] = {
      {{"hidden_states", DType::kBF16, {2, 7, 40}}, 1000, 2},  // 1120 bytes
      {{"hidden_states", DType::kBF16, {2, 7, 40}}, 1120, 1},
      {{"hidden_states", DType::kBF16, {2, 7, 40}}, 7, 160},
      {{"input_ids", DType::kI64, {3, 5}}, kDefaultMaxChunkBytes, 1},
      {{"loss", DType::kF32, {}}, 3, 2},
      {{"empty", DType::kF32, {0, 9}}, 16, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec.name + " chunk " + std::to_string(c.max_chunk));
    const std::vector<uint8_t> bytes = RandomBytes(*ByteSize(c.spec.dtype, c.spec.shape), 11);
    auto chunks = Encode(c.spec, bytes, c.max_chunk);
    ASSERT_EQ(chunks.size(), c.expected_chunks);
    for (const auto& chunk : chunks) EXPECT_LE(chunk.data().size(), c.max_chunk);
    auto decoded = DecodeTensors(Pointers(chunks));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ASSERT_EQ(decoded->size(), 1u);
    EXPECT_EQ((*decoded)[0].spec, c.spec);
    EXPECT_EQ((*decoded)[0].bytes, bytes);
  }
}

TEST(TensorCodecTest, SeveralTensorsInOneStreamAndSerialized) {
  const TensorSpec a{"a", DType::kF32, {100}}, b{"b", DType::kU8, {3, 3}};
  auto ba = RandomBytes(400, 1), bb = RandomBytes(9, 2);
  auto chunks = Encode(a, ba, 128);
  auto more = Encode(b, bb, 128);
  chunks.insert(chunks.end(), more.begin(), more.end());
  // Through the wire bytes, as gRPC would carry them.
  std::vector<v1::TensorChunk> parsed(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    ASSERT_TRUE(parsed[i].ParseFromString(chunks[i].SerializeAsString()));
  }
  auto decoded = DecodeTensors(Pointers(parsed));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->size(), 2u);
  EXPECT_EQ((*decoded)[0].bytes, ba);
  EXPECT_EQ((*decoded)[1].spec, b);
  EXPECT_EQ((*decoded)[1].bytes, bb);
}

TEST(TensorCodecTest, AssemblesIntoPreallocatedMemoryWithExpectedSpec) {
  const TensorSpec spec{"x", DType::kI32, {64}};
  auto bytes = RandomBytes(256, 5);
  auto chunks = Encode(spec, bytes, 100);
  std::vector<uint8_t> dest(256);
  TensorAssembler assembler([&](const TensorSpec& got, uint64_t nbytes) -> absl::StatusOr<void*> {
    if (!(got == spec)) return absl::InvalidArgumentError("unexpected tensor");
    EXPECT_EQ(nbytes, 256u);
    return static_cast<void*>(dest.data());
  });
  for (const auto& c : chunks) ASSERT_TRUE(assembler.Add(c).ok());
  EXPECT_TRUE(assembler.complete());
  EXPECT_EQ(dest, bytes);
}

TEST(TensorCodecTest, EncoderRefusesWrongSize) {
  std::vector<uint8_t> bytes(10);
  v1::TensorChunk scratch;
  absl::Status s = EncodeTensor({"x", DType::kF32, {3}}, bytes.data(), bytes.size(), 64, scratch,
                                [](v1::TensorChunk&) { return absl::OkStatus(); });
  EXPECT_THAT(s.message(), HasSubstr("tensor 'x': shape [3] of F32 needs 12 bytes, got 10"));
}

struct CorruptionCase {
  const char* label;
  std::function<void(std::vector<v1::TensorChunk>&)> corrupt;
  const char* error;
};

TEST(TensorCodecTest, CorruptStreamsAreRefusedWithReasons) {
  const TensorSpec spec{"hidden_states", DType::kBF16, {4, 32}};  // 256 bytes
  const std::vector<CorruptionCase> cases = {
      {"flipped byte", [](auto& c) { (*c[1].mutable_data())[3] ^= 0x40; },
       "tensor 'hidden_states' chunk 1: CRC-32C mismatch"},
      {"bad dtype", [](auto& c) { c[0].set_dtype(static_cast<v1::DType>(42)); },
       "chunk 0: unknown dtype value 42"},
      {"shape disagrees with size", [](auto& c) { c[0].set_shape(1, 31); },
       "shape [4, 31] of BF16 needs 248 bytes but the header says 256"},
      {"negative dimension", [](auto& c) { c[0].set_shape(0, -4); }, "negative dimension -4"},
      {"missing first chunk", [](auto& c) { c.erase(c.begin()); },
       "first chunk has index 1 and offset 100, expected 0 and 0"},
      {"dropped middle chunk", [](auto& c) { c.erase(c.begin() + 1); },
       "chunk 2: out of sequence: index 2 offset 200, expected index 1 offset 100"},
      {"reordered", [](auto& c) { std::swap(c[1], c[2]); }, "out of sequence"},
      {"header changes midway", [](auto& c) { c[2].set_name("other"); },
       "differs from the tensor's first chunk"},
      {"shape changes midway", [](auto& c) { c[1].set_shape(0, 2); },
       "differs from the tensor's first chunk"},
      {"overrun", [](auto& c) { c[2].mutable_data()->append(100, 'x'); },
       "156 data bytes at offset 200 overrun the tensor's 256 bytes"},
      {"short last chunk", [](auto& c) { c[2].mutable_data()->resize(10); },
       "is the last chunk but the tensor has 46 bytes left after it"},
      {"too large",
       [](auto& c) {
         c[0].set_shape(0, int64_t{1} << 40);
         c[0].set_total_bytes(uint64_t{1} << 46);
       },
       "exceeds the limit of"},
      {"empty name", [](auto& c) { c[0].clear_name(); }, "empty tensor name"},
      {"truncated stream", [](auto& c) { c.pop_back(); },
       "tensor 'hidden_states' is incomplete: the chunks ended early"},
      {"duplicate last chunk", [](auto& c) { c.push_back(c.back()); },
       "first chunk has index 2 and offset 200"},
  };
  const auto bytes = RandomBytes(256, 9);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    auto chunks = Encode(spec, bytes, 100);
    ASSERT_EQ(chunks.size(), 3u);
    c.corrupt(chunks);
    auto decoded = DecodeTensors(Pointers(chunks), /*max_total_bytes=*/1 << 20);
    ASSERT_FALSE(decoded.ok());
    EXPECT_THAT(decoded.status().message(), HasSubstr(c.error));
  }
}

TEST(TensorCodecTest, AssemblerStaysFailedAndRefusesChunksAfterCompletion) {
  const TensorSpec spec{"x", DType::kU8, {10}};
  auto bytes = RandomBytes(10, 1);
  auto chunks = Encode(spec, bytes, 4);
  std::vector<uint8_t> dest(10);
  TensorAssembler assembler(
      [&](const TensorSpec&, uint64_t) -> absl::StatusOr<void*> { return dest.data(); });
  for (const auto& c : chunks) ASSERT_TRUE(assembler.Add(c).ok());
  EXPECT_THAT(assembler.Add(chunks[0]).message(),
              HasSubstr("arrived after the tensor was complete"));
  // Once failed, it keeps the first error.
  EXPECT_THAT(assembler.Add(chunks[1]).message(),
              HasSubstr("arrived after the tensor was complete"));
  assembler.Reset();
  for (const auto& c : chunks) ASSERT_TRUE(assembler.Add(c).ok());
  EXPECT_TRUE(assembler.complete());
}

TEST(TensorCodecTest, AllocatorRefusalPropagates) {
  auto chunks = Encode({"x", DType::kU8, {4}}, RandomBytes(4, 1), 4);
  TensorAssembler assembler([](const TensorSpec& spec, uint64_t) -> absl::StatusOr<void*> {
    return absl::InvalidArgumentError("unexpected tensor '" + spec.name + "'");
  });
  EXPECT_THAT(assembler.Add(chunks[0]).message(), HasSubstr("unexpected tensor 'x'"));
}

// Packing with ChunkCrcWriter gives the same bytes as copying and zeroing, and the CRC of every
// chunk as EncodeTensor computes it, whatever the runs' sizes are against the chunk boundaries.
TEST(ChunkCrcWriterTest, CrcsEqualThoseOfTheEncodedChunks) {
  const std::vector<uint8_t> src = RandomBytes(5000, 3);
  for (size_t max_chunk : {size_t{1}, size_t{7}, size_t{64}, size_t{1000}, size_t{100000}}) {
    // Runs of data and zeros as a padded batch has them: 3 samples of 900, 1200, 1 bytes padded
    // to 1200 each.
    std::vector<uint8_t> packed(3600, 0xAA), expected(3600, 0);
    ChunkCrcWriter writer(packed.data(), packed.size(), max_chunk);
    size_t at = 0;
    for (size_t len : {size_t{900}, size_t{1200}, size_t{1}}) {
      ASSERT_TRUE(writer.Copy(src.data() + at, len).ok());
      ASSERT_TRUE(writer.Zero(1200 - len).ok());
      std::copy(src.begin() + at, src.begin() + at + len, expected.begin() + (at / 1200) * 1200);
      at += 1200;
    }
    absl::StatusOr<std::vector<uint32_t>> crcs = writer.Finish();
    ASSERT_TRUE(crcs.ok()) << crcs.status();
    EXPECT_EQ(packed, expected) << "max_chunk " << max_chunk;
    std::vector<uint32_t> want;
    v1::TensorChunk chunk;
    ASSERT_TRUE(EncodeTensor({"x", DType::kU8, {3600}}, expected.data(), expected.size(), max_chunk,
                             chunk,
                             [&](v1::TensorChunk& c) {
                               want.push_back(c.crc32c());
                               return absl::OkStatus();
                             })
                    .ok());
    EXPECT_EQ(*crcs, want) << "max_chunk " << max_chunk;
  }
}

TEST(ChunkCrcWriterTest, RefusesOverflowAndShortTensors) {
  std::vector<uint8_t> dst(10, 0);
  const std::vector<uint8_t> src(20, 1);
  ChunkCrcWriter writer(dst.data(), dst.size(), 4);
  ASSERT_TRUE(writer.Copy(src.data(), 6).ok());
  EXPECT_THAT(writer.Copy(src.data(), 5).message(), HasSubstr("overflows the tensor's 10 bytes"));
  EXPECT_THAT(writer.Zero(5).message(), HasSubstr("overflows"));
  EXPECT_EQ(writer.written(), 6u);
  EXPECT_THAT(writer.Finish().status().message(), HasSubstr("6 of the tensor's 10 bytes"));
  ChunkCrcWriter empty(nullptr, 0, 4);
  absl::StatusOr<std::vector<uint32_t>> crcs = empty.Finish();
  ASSERT_TRUE(crcs.ok());
  EXPECT_EQ(*crcs, std::vector<uint32_t>{0});  // one empty chunk, as EncodeTensor sends
}

}  // namespace
}  // namespace flashdraft
