#include "common/raw_client_stream.h"

namespace flashdraft {

RawClientStream::RawClientStream(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& method, grpc::ClientContext* context) {
  grpc::GenericStub stub(channel);
  stub.PrepareBidiStreamingCall(context, method, grpc::StubOptions(), this);
  {
    absl::MutexLock lock(&mu_);
    read_in_flight_ = true;
  }
  // Reads and writes are started from the owner's threads, outside reactions: the hold keeps the
  // call (and OnDone) from ending between a check of its state and the start of an operation.
  // Finish (or the destructor) lets it go.
  AddHold();
  StartRead(&reading_);
  StartCall();
}

RawClientStream::~RawClientStream() { Finish(); }

void RawClientStream::ReleaseHold() {
  {
    absl::MutexLock lock(&mu_);
    if (hold_released_) return;
    hold_released_ = true;
  }
  RemoveHold();
}

bool RawClientStream::Read(grpc::ByteBuffer* out) {
  {
    absl::MutexLock lock(&mu_, absl::Condition(this, &RawClientStream::ReadableLocked));
    if (ready_.empty()) return false;
    out->Swap(&ready_.front());
    ready_.pop_front();
    if (read_in_flight_ || reads_over_) return true;
    read_in_flight_ = true;
  }
  StartRead(&reading_);
  return true;
}

void RawClientStream::OnReadDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    if (!ok) {
      read_in_flight_ = false;
      reads_over_ = true;
      return;
    }
    ready_.emplace_back();
    ready_.back().Swap(&reading_);
    if (ready_.size() >= kReadAhead) {
      read_in_flight_ = false;  // Read starts the next one
      return;
    }
  }
  StartRead(&reading_);
}

bool RawClientStream::Write(grpc::ByteBuffer message) {
  absl::MutexLock writer(&write_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (done_ || !write_ok_ || writes_done_pending_) return false;
    writing_.Swap(&message);
    write_pending_ = true;
  }
  StartWrite(&writing_);
  absl::MutexLock lock(&mu_, absl::Condition(this, &RawClientStream::WriteSettledLocked));
  writing_.Clear();
  return write_ok_;
}

void RawClientStream::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  write_pending_ = false;
  write_ok_ = write_ok_ && ok;
}

void RawClientStream::WritesDone() {
  absl::MutexLock writer(&write_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (done_ || !write_ok_ || writes_done_pending_) return;
    writes_done_pending_ = true;
  }
  StartWritesDone();
  absl::MutexLock lock(&mu_, absl::Condition(this, &RawClientStream::WritesDoneSettledLocked));
}

void RawClientStream::OnWritesDoneDone(bool) {
  absl::MutexLock lock(&mu_);
  writes_done_pending_ = false;
  write_ok_ = false;  // nothing more may be written
}

grpc::Status RawClientStream::Finish() {
  ReleaseHold();
  absl::MutexLock lock(&mu_, absl::Condition(&done_));
  return status_;
}

void RawClientStream::OnDone(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  status_ = status;
  done_ = true;
  reads_over_ = true;
}

}  // namespace flashdraft
