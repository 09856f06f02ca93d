#include "coordinator/checkpoint_upload.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

TEST(UploadReceiverTest, AssemblesAWholeUpload) {
  UploadReceiver receiver(1 << 20);
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
  UploadReceiver receiver(1 << 20);
  const std::vector<v1::TensorChunk> chunks = Chunks("drafter.a", RandomBytes(100, 3));
  EXPECT_EQ(receiver.Add("tok", chunks[0]).code(), absl::StatusCode::kFailedPrecondition);
  // Nothing asked for: stale.
  EXPECT_EQ(receiver.Begin("tok", Announce(1, 1)).code(), absl::StatusCode::kFailedPrecondition);
  receiver.Expect("tok", 1);
  // Another worker, or another step: stale too.
  EXPECT_EQ(receiver.Begin("other", Announce(1, 1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(receiver.Begin("tok", Announce(2, 1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(receiver.Begin("tok", Announce(1, 0)).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(receiver.Begin("tok", Announce(1, 1)).ok());
  EXPECT_EQ(receiver.Begin("tok", Announce(1, 1)).code(), absl::StatusCode::kInvalidArgument);
  // Another worker's chunk is not part of this upload.
  EXPECT_EQ(receiver.Add("other", chunks[0]).code(), absl::StatusCode::kFailedPrecondition);
  v1::TensorChunk bad = chunks[0];
  bad.set_crc32c(bad.crc32c() ^ 1);
  EXPECT_THAT(std::string(receiver.Add("tok", bad).message()), HasSubstr("CRC"));
  receiver.Reset();
  EXPECT_FALSE(receiver.active());
}

TEST(UploadReceiverTest, BoundsTheBytesBeforeAllocating) {
  UploadReceiver receiver(150);
  receiver.Expect("tok", 1);
  ASSERT_TRUE(receiver.Begin("tok", Announce(1, 2)).ok());
  for (const v1::TensorChunk& c : Chunks("drafter.a", RandomBytes(100, 4))) {
    ASSERT_TRUE(receiver.Add("tok", c).ok());
  }
  // 100 + 100 > 150: refused on the first chunk, whatever its header claims.
  v1::TensorChunk huge = Chunks("drafter.b", RandomBytes(100, 5))[0];
  EXPECT_THAT(std::string(receiver.Add("tok", huge).message()),
              HasSubstr("makes the upload larger than 150 bytes"));
  huge.set_total_bytes(uint64_t{1} << 60);
  receiver.Expect("tok", 1);
  ASSERT_TRUE(receiver.Begin("tok", Announce(1, 1)).ok());
  EXPECT_FALSE(receiver.Add("tok", huge).ok());
}

}  // namespace
}  // namespace flashdraft
