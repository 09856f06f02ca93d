#include "coordinator/checkpoint_upload.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/grpc_options.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::RandomBytes;
using ::testing::HasSubstr;

v1::CheckpointUpload Announce(uint64_t steps, uint32_t tensors) {
  v1::CheckpointUpload a;
  a.set_completed_steps(steps);
  a.set_num_tensors(tensors);
  return a;
}

// The chunks of one tensor of `nbytes` bytes, at most 64 bytes each.
std::vector<v1::TensorChunk> Chunks(const std::string& name, const std::vector<uint8_t>& bytes) {
  std::vector<v1::TensorChunk> out;
  v1::TensorChunk chunk;
  EXPECT_TRUE(EncodeTensor({name, DType::kU8, {static_cast<int64_t>(bytes.size())}}, bytes.data(),
                           bytes.size(), 64, chunk,
                           [&](v1::TensorChunk& c) {
                             out.push_back(c);
                             return absl::OkStatus();
                           })
                  .ok());
  return out;
}

// An upload of two U8 tensors: "drafter.a" [200] and "adamw.step" [8].
UploadReceiver Receiver() {
  return UploadReceiver({{"drafter.a", DType::kU8, {200}}, {"adamw.step", DType::kU8, {8}}});
}

TEST(UploadReceiverTest, TheSpecsAreTheWorkersSnapshot) {
  std::vector<TensorSpec> specs = CheckpointUploadSpecs({{"fc.weight", DType::kF32, {4, 8}}});
  ASSERT_EQ(specs.size(), 4u);
  EXPECT_EQ(specs[0], (TensorSpec{"drafter.fc.weight", DType::kF32, {4, 8}}));
  EXPECT_EQ(specs[1], (TensorSpec{"adamw.fc.weight.exp_avg", DType::kF32, {4, 8}}));
  EXPECT_EQ(specs[2], (TensorSpec{"adamw.fc.weight.exp_avg_sq", DType::kF32, {4, 8}}));
  EXPECT_EQ(specs[3], (TensorSpec{"adamw.step", DType::kI64, {1}}));
}

TEST(UploadReceiverTest, AssemblesAWholeUpload) {
  UploadReceiver receiver = Receiver();
  const std::vector<uint8_t> a = RandomBytes(200, 1), b = RandomBytes(8, 2);
  receiver.Expect("tok", 50);
  ASSERT_TRUE(receiver.Begin("tok", Announce(50, 2)).ok());
  EXPECT_TRUE(receiver.active());
  for (const v1::TensorChunk& c : Chunks("drafter.a", a)) ASSERT_TRUE(receiver.Add("tok", c).ok());
  EXPECT_FALSE(receiver.Complete(50));
  for (const v1::TensorChunk& c : Chunks("adamw.step", b)) ASSERT_TRUE(receiver.Add("tok", c).ok());
  EXPECT_FALSE(receiver.Complete(40));
  ASSERT_TRUE(receiver.Complete(50));
  std::vector<OwnedTensor> tensors = receiver.Take();
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].spec.name, "drafter.a");
  EXPECT_EQ(tensors[0].bytes, a);
  EXPECT_EQ(tensors[1].bytes, b);
  EXPECT_FALSE(receiver.Complete(50));  // taken
}

TEST(UploadReceiverTest, RefusesWhatDoesNotBelong) {
  UploadReceiver receiver = Receiver();
  const std::vector<v1::TensorChunk> chunks = Chunks("drafter.a", RandomBytes(200, 3));
  EXPECT_EQ(receiver.Add("tok", chunks[0]).code(), absl::StatusCode::kFailedPrecondition);
  // Nothing asked for: stale.
  EXPECT_EQ(receiver.Begin("tok", Announce(1, 1)).code(), absl::StatusCode::kFailedPrecondition);
  receiver.Expect("tok", 1);
  // Another worker, or another step: stale too.
  EXPECT_EQ(receiver.Begin("other", Announce(1, 1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(receiver.Begin("tok", Announce(2, 1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(receiver.Begin("tok", Announce(1, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(receiver.Begin("tok", Announce(1, 3)).message()),
              HasSubstr("an upload of 3 tensors; the drafter's state has 2"));
  ASSERT_TRUE(receiver.Begin("tok", Announce(1, 2)).ok());
  EXPECT_EQ(receiver.Begin("tok", Announce(1, 2)).code(), absl::StatusCode::kInvalidArgument);
  // Another worker's chunk is not part of this upload.
  EXPECT_EQ(receiver.Add("other", chunks[0]).code(), absl::StatusCode::kFailedPrecondition);
  v1::TensorChunk bad = chunks[0];
  bad.set_crc32c(bad.crc32c() ^ 1);
  EXPECT_THAT(std::string(receiver.Add("tok", bad).message()), HasSubstr("CRC"));
  receiver.Reset();
  EXPECT_FALSE(receiver.active());
}

TEST(UploadReceiverTest, AllocatesOnlyTheExpectedTensorsOnce) {
  UploadReceiver receiver = Receiver();
  auto begin = [&] {
    receiver.Expect("tok", 1);
    ASSERT_TRUE(receiver.Begin("tok", Announce(1, 2)).ok());
  };
  begin();
  // Another name, another shape, a claim of 2^60 bytes, the same tensor twice: refused on the
  // first chunk, before anything is allocated.
  EXPECT_THAT(
      std::string(receiver.Add("tok", Chunks("drafter.evil", RandomBytes(10, 4))[0]).message()),
      HasSubstr("tensor 'drafter.evil' is not part of the drafter's state"));
  begin();
  EXPECT_THAT(
      std::string(receiver.Add("tok", Chunks("drafter.a", RandomBytes(100, 4))[0]).message()),
      HasSubstr("tensor 'drafter.a' is U8 [100]; the drafter's is U8 [200]"));
  begin();
  v1::TensorChunk huge = Chunks("drafter.a", RandomBytes(200, 5))[0];
  huge.clear_shape();
  huge.add_shape(int64_t{1} << 60);
  huge.set_total_bytes(uint64_t{1} << 60);
  EXPECT_FALSE(receiver.Add("tok", huge).ok());
  begin();
  for (const v1::TensorChunk& c : Chunks("drafter.a", RandomBytes(200, 6))) {
    ASSERT_TRUE(receiver.Add("tok", c).ok());
  }
  EXPECT_THAT(
      std::string(receiver.Add("tok", Chunks("drafter.a", RandomBytes(200, 6))[0]).message()),
      HasSubstr("tensor 'drafter.a' came twice"));
}

// Tensors of exactly 3 chunks (64 KiB here), of 2 and a part, and of more than gRPC's message
// limit arrive whole, streamed chunk by chunk as the worker sends them.
TEST(UploadReceiverTest, TensorsOfSeveralChunksArriveWhole) {
  constexpr int64_t kChunk = 64 << 10;
  constexpr int64_t kBig = kMaxMessageBytes + 12345;
  const std::vector<OwnedTensor> upload = {
      {{"drafter.a", DType::kU8, {3 * kChunk}}, RandomBytes(3 * kChunk, 1)},
      {{"drafter.b", DType::kF32, {(2 * kChunk + 400) / 4}}, RandomBytes(2 * kChunk + 400, 2)},
      {{"adamw.big", DType::kU8, {kBig}}, RandomBytes(kBig, 3)},
      {{"adamw.step", DType::kI64, {1}}, RandomBytes(8, 4)}};
  std::vector<TensorSpec> specs;
  for (const OwnedTensor& t : upload) specs.push_back(t.spec);
  UploadReceiver receiver(specs);
  receiver.Expect("tok", 9);
  ASSERT_TRUE(receiver.Begin("tok", Announce(9, static_cast<uint32_t>(upload.size()))).ok());
  v1::TensorChunk scratch;
  for (const OwnedTensor& t : upload) {
    uint64_t chunks = 0;
    const absl::Status sent = EncodeTensor(t.spec, t.bytes.data(), t.bytes.size(), kChunk, scratch,
                                           [&](v1::TensorChunk& c) {
                                             ++chunks;
                                             return receiver.Add("tok", c);
                                           });
    ASSERT_TRUE(sent.ok()) << sent;
    EXPECT_EQ(chunks, NumChunks(t.bytes.size(), kChunk)) << t.spec.name;
  }
  ASSERT_TRUE(receiver.Complete(9));
  const std::vector<OwnedTensor> got = receiver.Take();
  ASSERT_EQ(got.size(), upload.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].spec, upload[i].spec);
    EXPECT_TRUE(got[i].bytes == upload[i].bytes) << upload[i].spec.name;  // not 64 MiB printed
  }
}

}  // namespace
}  // namespace flashdraft
