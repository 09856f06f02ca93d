#include "worker/checkpoint_uploader.h"

#include <utility>

#include "glog/logging.h"

namespace flashdraft {

CheckpointUploader::CheckpointUploader(Write write, FaultPlan fault)
    : write_(std::move(write)), fault_(std::move(fault)) {}

CheckpointUploader::~CheckpointUploader() { Finish(); }

void CheckpointUploader::Start(NamedTensors snapshot, uint64_t completed_steps, int rank,
                               uint64_t epoch) {
  Finish();
  thread_ = std::thread([this, snapshot = std::move(snapshot), completed_steps, rank, epoch] {
    Send(snapshot, completed_steps, rank, epoch);
  });
}

void CheckpointUploader::Finish() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointUploader::Send(const NamedTensors& snapshot, uint64_t completed_steps, int rank,
                              uint64_t epoch) const {
  bool corrupt = FaultDue(fault_, "corrupt", completed_steps, rank, epoch);
  const absl::Status sent = SendCheckpoint(
      snapshot, completed_steps,
      [&](v1::WorkerMessage& m) {
        if (corrupt && m.has_tensor_chunk()) {  // fault test: one chunk with a wrong CRC
          LOG(WARNING) << "FLASHDRAFT_FAULT: corrupting the checkpoint upload";
          m.mutable_tensor_chunk()->set_crc32c(m.tensor_chunk().crc32c() ^ 1);
          corrupt = false;
        }
        return write_(m);
      },
      [&] { MaybeFault(fault_, "upload", completed_steps, rank, epoch); });
  if (!sent.ok()) {
    LOG(WARNING) << "checkpoint upload after step " << completed_steps << ": " << sent.message();
  }
}

}  // namespace flashdraft
