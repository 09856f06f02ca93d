// The checkpoint uploader against the coordinator's receiving end
// (coordinator/checkpoint_upload.h): uploads from a thread of its own, one at a time, and the fault
// tests' corrupt point.
#include "worker/checkpoint_uploader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "coordinator/checkpoint_upload.h"
#include "model/wire_tensor.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

NamedTensors Snapshot(float value) {
  return {{"drafter.fc.weight", torch::full({3, 5}, value)},
          {"adamw.fc.weight.exp_avg", torch::full({3, 5}, value / 2)},
          {"adamw.step", torch::full({1}, int64_t{7}, torch::kInt64)}};
}

std::vector<TensorSpec> SpecsOf(const NamedTensors& tensors) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : tensors) {
    specs.push_back({name, FromTorchDType(t.scalar_type()).value(), t.sizes().vec()});
  }
  return specs;
}

// What an uploader wrote, and on which thread.
struct Recorder {
  absl::Mutex mu;
  std::vector<v1::WorkerMessage> written ABSL_GUARDED_BY(mu);
  std::vector<std::thread::id> threads ABSL_GUARDED_BY(mu);

  CheckpointUploader::Write Writer() {
    return [this](v1::WorkerMessage& m) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // two uploads would interleave
      absl::MutexLock lock(&mu);
      written.push_back(m);
      threads.push_back(std::this_thread::get_id());
      return true;
    };
  }
  std::vector<v1::WorkerMessage> Written() {
    absl::MutexLock lock(&mu);
    return written;
  }
};

// Feeds an upload's messages to the coordinator's receiver; the first error, or OK.
absl::Status Receive(UploadReceiver& receiver, const std::vector<v1::WorkerMessage>& messages) {
  for (const v1::WorkerMessage& m : messages) {
    const absl::Status s = m.has_checkpoint() ? receiver.Begin("token", m.checkpoint())
                                              : receiver.Add("token", m.tensor_chunk());
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

TEST(CheckpointUploaderTest, UploadsFromItsOwnThreadOneAtATime) {
  Recorder recorder;
  CheckpointUploader uploader(recorder.Writer(), FaultPlan{});
  uploader.Start(Snapshot(1), 3, /*rank=*/0, /*epoch=*/1);
  uploader.Start(Snapshot(2), 4, 0, 1);  // waits for the first
  uploader.Finish();
  const std::vector<v1::WorkerMessage> written = recorder.Written();
  ASSERT_EQ(written.size(), 2 * (1 + 3u));  // an announcement and one chunk per tensor, twice
  ASSERT_TRUE(written[0].has_checkpoint());
  EXPECT_EQ(written[0].checkpoint().completed_steps(), 3u);
  ASSERT_TRUE(written[4].has_checkpoint());
  EXPECT_EQ(written[4].checkpoint().completed_steps(), 4u);
  {
    absl::MutexLock lock(&recorder.mu);
    for (const std::thread::id& id : recorder.threads) EXPECT_NE(id, std::this_thread::get_id());
  }
  // Each is an upload the coordinator takes whole.
  for (int i = 0; i < 2; ++i) {
    UploadReceiver receiver(SpecsOf(Snapshot(1)));
    receiver.Expect("token", 3 + i);
    const std::vector<v1::WorkerMessage> upload(written.begin() + 4 * i,
                                                written.begin() + 4 * (i + 1));
    ASSERT_TRUE(Receive(receiver, upload).ok());
    EXPECT_TRUE(receiver.Complete(3 + i));
  }
}

// FLASHDRAFT_FAULT=corrupt:step=3:rank=0 — rank 0 of the first epoch sends the state after 3 steps
// with one wrong CRC, which the coordinator refuses; later epochs upload intact.
TEST(CheckpointUploaderTest, TheCorruptFaultBreaksOneChunkOfTheFirstEpochsUpload) {
  FaultPlan corrupt;
  corrupt.point = "corrupt";
  corrupt.step = 3;
  corrupt.rank = 0;
  corrupt.armed = true;
  for (uint64_t epoch : {1, 2}) {
    Recorder recorder;
    {
      CheckpointUploader uploader(recorder.Writer(), corrupt);
      uploader.Start(Snapshot(1), 3, 0, epoch);
    }  // the destructor waits for the upload
    UploadReceiver receiver(SpecsOf(Snapshot(1)));
    receiver.Expect("token", 3);
    const absl::Status s = Receive(receiver, recorder.Written());
    if (epoch == 1) {
      EXPECT_FALSE(s.ok());
      EXPECT_THAT(std::string(s.message()), HasSubstr("CRC"));
    } else {
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_TRUE(receiver.Complete(3));
    }
  }
}

}  // namespace
}  // namespace flashdraft
