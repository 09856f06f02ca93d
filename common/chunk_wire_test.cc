#include "common/chunk_wire.h"

#include <gmock/gmock.h>
#include <grpcpp/support/slice.h>
#include <gtest/gtest.h>

#include <random>

#include "flashdraft/v1/coordinator.pb.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::RandomBytes;

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Valid()) return out;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// The same bytes as `buffer`, cut into slices of `piece` bytes (as a receiver may see them).
grpc::ByteBuffer Resliced(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i < bytes.size(); i += piece) {
    slices.emplace_back(bytes.data() + i, std::min(piece, bytes.size() - i));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::vector<grpc::ByteBuffer> EncodeBuffers(const TensorSpec& spec,
                                            const std::shared_ptr<std::vector<uint8_t>>& bytes,
                                            size_t max_chunk, int wrapper) {
  std::vector<grpc::ByteBuffer> out;
  absl::Status s =
      EncodeTensorBuffers(spec, bytes->data(), bytes->size(), max_chunk, bytes, wrapper, &out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// The zero-copy encoding is byte for byte the protobuf encoding of the same messages.
TEST(ChunkWireTest, BytesEqualProtobufEncoding) {
  const TensorSpec spec{"hidden_states", DType::kBF16, {3, 1000}};
  auto bytes = std::make_shared<std::vector<uint8_t>>(RandomBytes(6000, 1));
  for (int wrapper : {0, kCoordinatorMessageChunkField}) {
    std::vector<grpc::ByteBuffer> buffers = EncodeBuffers(spec, bytes, 1024, wrapper);
    std::vector<v1::TensorChunk> expected;
    ASSERT_TRUE(AppendTensorChunks(spec, bytes->data(), bytes->size(), 1024, [&] {
                  expected.emplace_back();
                  return &expected.back();
                }).ok());
    ASSERT_EQ(buffers.size(), expected.size());
    for (size_t i = 0; i < buffers.size(); ++i) {
      std::string want;
      if (wrapper == 0) {
        want = expected[i].SerializeAsString();
      } else {
        v1::CoordinatorMessage m;
        *m.mutable_tensor_chunk() = expected[i];
        want = m.SerializeAsString();
      }
      EXPECT_EQ(Flatten(buffers[i]), want) << "chunk " << i << " wrapper " << wrapper;
    }
  }
}

// CRCs known in advance (from ChunkCrcWriter) give the same bytes; a wrong count is refused.
TEST(ChunkWireTest, KnownCrcsGiveTheSameBytes) {
  const TensorSpec spec{"hidden_states", DType::kBF16, {3, 1000}};
  auto bytes = std::make_shared<std::vector<uint8_t>>(RandomBytes(6000, 2));
  std::vector<uint8_t> packed(bytes->size());
  ChunkCrcWriter writer(packed.data(), packed.size(), 1024);
  ASSERT_TRUE(writer.Copy(bytes->data(), bytes->size()).ok());
  absl::StatusOr<std::vector<uint32_t>> crcs = writer.Finish();
  ASSERT_TRUE(crcs.ok());
  std::vector<grpc::ByteBuffer> known;
  ASSERT_TRUE(EncodeTensorBuffers(spec, bytes->data(), bytes->size(), 1024, bytes,
                                  kCoordinatorMessageChunkField, &known, *crcs)
                  .ok());
  std::vector<grpc::ByteBuffer> computed =
      EncodeBuffers(spec, bytes, 1024, kCoordinatorMessageChunkField);
  ASSERT_EQ(known.size(), computed.size());
  for (size_t i = 0; i < known.size(); ++i) EXPECT_EQ(Flatten(known[i]), Flatten(computed[i]));
  std::vector<grpc::ByteBuffer> out;
  const std::vector<uint32_t> too_few(crcs->begin(), crcs->end() - 1);
  EXPECT_THAT(EncodeTensorBuffers(spec, bytes->data(), bytes->size(), 1024, bytes, 0, &out, too_few)
                  .message(),
              ::testing::HasSubstr("5 chunk CRCs for 6 chunks"));
}

TEST(ChunkWireTest, ParsesAcrossAnySliceBoundariesAndAssembles) {
  const TensorSpec spec{"x", DType::kF32, {257, 3}};
  auto bytes = std::make_shared<std::vector<uint8_t>>(RandomBytes(257 * 3 * 4, 2));
  for (size_t piece : {1, 3, 7, 64, 100000}) {
    std::vector<grpc::ByteBuffer> buffers =
        EncodeBuffers(spec, bytes, 500, kCoordinatorMessageChunkField);
    std::vector<uint8_t> dest(bytes->size(), 0);
    TensorAssembler assembler([&](const TensorSpec& s, uint64_t n) -> absl::StatusOr<void*> {
      EXPECT_EQ(s, spec);
      EXPECT_EQ(n, dest.size());
      return static_cast<void*>(dest.data());
    });
    for (const grpc::ByteBuffer& b : buffers) {
      ReceivedChunk chunk;
      ASSERT_TRUE(
          ParseChunkBuffer(Resliced(Flatten(b), piece), kCoordinatorMessageChunkField, &chunk))
          << "piece " << piece;
      EXPECT_TRUE(chunk.header.data().empty());
      ASSERT_TRUE(assembler.Add(chunk.header, chunk.data).ok());
    }
    EXPECT_TRUE(assembler.complete());
    EXPECT_EQ(dest, *bytes) << "piece " << piece;
  }
}

TEST(ChunkWireTest, EmptyTensorIsOneChunkWithoutData) {
  const TensorSpec spec{"anchors", DType::kI64, {0, 4}};
  auto bytes = std::make_shared<std::vector<uint8_t>>();
  std::vector<grpc::ByteBuffer> buffers = EncodeBuffers(spec, bytes, 1024, 0);
  ASSERT_EQ(buffers.size(), 1u);
  ReceivedChunk chunk;
  ASSERT_TRUE(ParseChunkBuffer(buffers[0], 0, &chunk));
  EXPECT_EQ(chunk.header.name(), "anchors");
  TensorAssembler assembler(
      [](const TensorSpec&, uint64_t) -> absl::StatusOr<void*> { return nullptr; });
  ASSERT_TRUE(assembler.Add(chunk.header, chunk.data).ok());
  EXPECT_TRUE(assembler.complete());
}

TEST(ChunkWireTest, OtherMessagesAreNotChunks) {
  v1::CoordinatorMessage commit;
  commit.mutable_commit()->set_step(7);
  v1::CoordinatorMessage batch;
  batch.mutable_microbatch()->set_step(3);
  batch.mutable_microbatch()->set_num_tensors(4);
  for (const auto* m : {&commit, &batch}) {
    ReceivedChunk chunk;
    EXPECT_FALSE(ParseChunkBuffer(MessageToBuffer(*m), kCoordinatorMessageChunkField, &chunk));
    v1::CoordinatorMessage back;
    ASSERT_TRUE(BufferToMessage(MessageToBuffer(*m), &back));
    EXPECT_EQ(back.SerializeAsString(), m->SerializeAsString());
  }
  // An empty message is a valid (empty) protobuf and not a chunk.
  ReceivedChunk chunk;
  EXPECT_FALSE(ParseChunkBuffer(grpc::ByteBuffer(), kCoordinatorMessageChunkField, &chunk));
  v1::CoordinatorMessage empty;
  EXPECT_TRUE(BufferToMessage(grpc::ByteBuffer(), &empty));
}

TEST(ChunkWireTest, MalformedBuffersAreRefused) {
  const TensorSpec spec{"x", DType::kU8, {100}};
  auto bytes = std::make_shared<std::vector<uint8_t>>(RandomBytes(100, 3));
  const std::string good = Flatten(EncodeBuffers(spec, bytes, 1000, 4)[0]);
  ReceivedChunk chunk;
  ASSERT_TRUE(ParseChunkBuffer(Resliced(good, 9), 4, &chunk));
  // Every truncation, and garbage.
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(ParseChunkBuffer(Resliced(good.substr(0, n), 5), 4, &chunk)) << n;
  }
  EXPECT_FALSE(ParseChunkBuffer(Resliced(std::string(64, '\xff'), 8), 4, &chunk));
  // Bytes after the data field, or a different wrapper field.
  EXPECT_FALSE(ParseChunkBuffer(Resliced(good + "\x08\x01", 16), 4, &chunk));
  EXPECT_FALSE(ParseChunkBuffer(Resliced(good, 16), 3, &chunk));
  // Corrupted data parses but fails the assembler's CRC check.
  std::string bad = good;
  bad.back() ^= 0x01;
  ASSERT_TRUE(ParseChunkBuffer(Resliced(bad, 16), 4, &chunk));
  std::vector<uint8_t> dest(100);
  TensorAssembler assembler(
      [&](const TensorSpec&, uint64_t) -> absl::StatusOr<void*> { return dest.data(); });
  absl::Status s = assembler.Add(chunk.header, chunk.data);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("CRC-32C mismatch"));
  // A header that still carries data is a caller error.
  v1::TensorChunk with_data;
  with_data.set_data("x");
  TensorAssembler other(
      [&](const TensorSpec&, uint64_t) -> absl::StatusOr<void*> { return dest.data(); });
  EXPECT_FALSE(other.Add(with_data, {}).ok());
}

TEST(ChunkWireTest, OwnerIsHeldUntilGrpcReleasesTheSlice) {
  const TensorSpec spec{"x", DType::kU8, {4096}};
  auto bytes = std::make_shared<std::vector<uint8_t>>(RandomBytes(4096, 4));
  std::weak_ptr<std::vector<uint8_t>> weak = bytes;
  {
    std::vector<grpc::ByteBuffer> buffers = EncodeBuffers(spec, bytes, 1024, 4);
    bytes.reset();
    EXPECT_FALSE(weak.expired());
    ReceivedChunk chunk;
    ASSERT_TRUE(ParseChunkBuffer(buffers[0], 4, &chunk));
    buffers.clear();
    EXPECT_FALSE(weak.expired());  // the parsed chunk still references the slice
  }
  EXPECT_TRUE(weak.expired());
}

}  // namespace
}  // namespace flashdraft
