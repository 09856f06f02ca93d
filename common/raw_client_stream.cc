#include "common/raw_client_stream.h"

namespace flashdraft {

RawClientStream::RawClientStream(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& method, grpc::ClientContext* context) {
  grpc::GenericStub stub(channel);
  stub.PrepareBidiStreamingCall(context, method, grpc::StubOptions(), this);
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
    if (hold_released_) return;
    hold_released_ = true;
  }
  RemoveHold();
}

bool RawClientStream::Read(grpc::ByteBuffer* out) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty() || reads_over_; });
  if (ready_.empty()) return false;
  out->Swap(&ready_.front());
  ready_.pop_front();
  if (!read_in_flight_ && !reads_over_) {
    read_in_flight_ = true;
    lock.unlock();
    StartRead(&reading_);
  }
  return true;
}

void RawClientStream::OnReadDone(bool ok) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!ok) {
    read_in_flight_ = false;
    reads_over_ = true;
    cv_.notify_all();
    return;
  }
  ready_.emplace_back();
  ready_.back().Swap(&reading_);
  cv_.notify_all();
  if (ready_.size() >= kReadAhead) {
    read_in_flight_ = false;  // Read starts the next one
    return;
  }
  lock.unlock();
  StartRead(&reading_);
}

bool RawClientStream::Write(grpc::ByteBuffer message) {
  std::lock_guard<std::mutex> writer(write_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ || !write_ok_ || writes_done_pending_) return false;
    writing_.Swap(&message);
    write_pending_ = true;
  }
  StartWrite(&writing_);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !write_pending_; });
  writing_.Clear();
  return write_ok_;
}

void RawClientStream::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  write_pending_ = false;
  write_ok_ = write_ok_ && ok;
  cv_.notify_all();
}

void RawClientStream::WritesDone() {
  std::lock_guard<std::mutex> writer(write_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ || !write_ok_ || writes_done_pending_) return;
    writes_done_pending_ = true;
  }
  StartWritesDone();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !writes_done_pending_ || done_; });
}

void RawClientStream::OnWritesDoneDone(bool) {
  std::lock_guard<std::mutex> lock(mu_);
  writes_done_pending_ = false;
  write_ok_ = false;  // nothing more may be written
  cv_.notify_all();
}

grpc::Status RawClientStream::Finish() {
  ReleaseHold();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  return status_;
}

void RawClientStream::OnDone(const grpc::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  status_ = status;
  done_ = true;
  reads_over_ = true;
  cv_.notify_all();
}

}  // namespace flashdraft
