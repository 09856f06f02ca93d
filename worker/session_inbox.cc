#include "worker/session_inbox.h"

#include <algorithm>

#include "common/chunk_wire.h"

namespace flashdraft {

SessionInbox::SessionInbox() : assembler_(sink_.allocator()) {}

void SessionInbox::Fail(std::string why) {
  newest_epoch_ = kSessionOver;
  stream_lost_ = true;
  InboxItem item;
  item.kind = InboxItem::kError;
  item.text = std::move(why);
  queue_.Push(std::move(item));
}

void SessionInbox::PushBatch() {
  ++queued_batches_;
  queue_.Push(std::move(pending_));
}

template <typename AddTo>
bool SessionInbox::AddChunk(const AddTo& add_to) {
  if (remaining_ == 0) {
    Fail("a tensor chunk arrived outside a microbatch");
    return false;
  }
  absl::Status s = add_to(assembler_);
  if (!s.ok()) {
    Fail(std::string(s.message()));
    return false;
  }
  if (assembler_.complete()) {
    pending_.tensors[assembler_.spec().name] = sink_.tensor;
    assembler_.Reset();
    if (--remaining_ == 0) PushBatch();
  }
  return true;
}

bool SessionInbox::Take(const grpc::ByteBuffer& buffer) {
  if (ParseChunkBuffer(buffer, kCoordinatorMessageChunkField, &chunk_)) {
    return AddChunk([&](TensorAssembler& a) { return a.Add(chunk_.header, chunk_.data); });
  }
  v1::CoordinatorMessage& msg = message_;
  if (!BufferToMessage(buffer, &msg)) {
    Fail("the coordinator sent a malformed CoordinatorMessage");
    return false;
  }
  InboxItem item;
  switch (msg.kind_case()) {
    case v1::CoordinatorMessage::kMicrobatch:
      if (remaining_ != 0) {
        Fail("a microbatch began before the previous one ended");
        return false;
      }
      pending_ = InboxItem();
      pending_.kind = InboxItem::kBatch;
      pending_.header = msg.microbatch();
      pending_.step = msg.microbatch().step();
      remaining_ = msg.microbatch().num_tensors();
      if (remaining_ == 0) PushBatch();
      return true;
    case v1::CoordinatorMessage::kTensorChunk:  // another protobuf encoder's field order
      return AddChunk([&](TensorAssembler& a) { return a.Add(msg.tensor_chunk()); });
    case v1::CoordinatorMessage::kCommit:
      item.kind = InboxItem::kCommit;
      item.step = msg.commit().step();
      item.epoch = msg.commit().membership_epoch();
      item.checkpoint = msg.commit().checkpoint();
      queue_.Push(std::move(item));
      return true;
    case v1::CoordinatorMessage::kReform:
      if (remaining_ != 0) {
        Fail("a Reform arrived inside a microbatch");
        return false;
      }
      newest_epoch_ = std::max<uint64_t>(newest_epoch_, msg.reform().membership_epoch());
      item.kind = InboxItem::kReform;
      item.reform = msg.reform();
      queue_.Push(std::move(item));
      return true;
    case v1::CoordinatorMessage::kShutdown:
      newest_epoch_ = kSessionOver;
      item.kind = InboxItem::kShutdown;
      item.text = msg.shutdown().reason();
      item.job_finished = msg.shutdown().job_finished();
      queue_.Push(std::move(item));
      return false;
    default:  // a newer coordinator's message this worker does not know
      return true;
  }
}

void SessionInbox::ReadAll(CoordinatorLink& link) {
  grpc::ByteBuffer buffer;
  while (link.Read(&buffer)) {
    if (metrics_ != nullptr) metrics_->AddReceivedBytes(buffer.Length());
    if (!Take(buffer)) return;
  }
  Fail("the coordinator closed the Train stream");
}

}  // namespace flashdraft
