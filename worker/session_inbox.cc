#include "worker/session_inbox.h"

#include <algorithm>
#include <optional>
#include <thread>

#include "common/chunk_wire.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace flashdraft {

void SessionInbox::Fail(std::string why) {
  newest_epoch_ = kSessionOver;
  stream_lost_ = true;
  InboxItem item;
  item.kind = InboxItem::kError;
  item.text = std::move(why);
  queue_.Push(std::move(item));
}

void SessionInbox::PushBatch(Assembly& a) {
  ++queued_batches_;
  queue_.Push(std::move(a.pending));
  a.pending = InboxItem();
}

template <typename AddTo>
absl::Status SessionInbox::AddChunk(Assembly& a, const AddTo& add_to, bool* pushed) {
  if (a.remaining == 0) return absl::DataLossError("a tensor chunk arrived outside a microbatch");
  FD_RETURN_IF_ERROR(add_to(a.assembler));
  if (a.assembler.complete()) {
    a.pending.tensors[a.assembler.spec().name] = a.sink.tensor;
    a.assembler.Reset();
    if (--a.remaining == 0) {
      PushBatch(a);
      if (pushed != nullptr) *pushed = true;
    }
  }
  return absl::OkStatus();
}

absl::Status SessionInbox::BeginBatch(Assembly& a, const v1::Microbatch& header, bool* pushed) {
  if (a.remaining != 0) {
    return absl::DataLossError("a microbatch began before the previous one ended");
  }
  a.pending = InboxItem();
  a.pending.kind = InboxItem::kBatch;
  a.pending.header = header;
  a.pending.step = header.step();
  a.remaining = header.num_tensors();
  if (a.remaining == 0) {
    PushBatch(a);
    if (pushed != nullptr) *pushed = true;
  }
  return absl::OkStatus();
}

bool SessionInbox::Take(const grpc::ByteBuffer& buffer) {
  Assembly& a = stream_;
  absl::Status s;
  if (ParseChunkBuffer(buffer, kCoordinatorMessageChunkField, &a.chunk)) {
    s = AddChunk(a, [&](TensorAssembler& t) { return t.Add(a.chunk.header, a.chunk.data); });
    if (!s.ok()) Fail(std::string(s.message()));
    return s.ok();
  }
  v1::CoordinatorMessage& msg = a.message;
  if (!BufferToMessage(buffer, &msg)) {
    Fail("the coordinator sent a malformed CoordinatorMessage");
    return false;
  }
  InboxItem item;
  switch (msg.kind_case()) {
    case v1::CoordinatorMessage::kMicrobatch:
      s = BeginBatch(a, msg.microbatch());
      break;
    case v1::CoordinatorMessage::kTensorChunk:  // another protobuf encoder's field order
      s = AddChunk(a, [&](TensorAssembler& t) { return t.Add(msg.tensor_chunk()); });
      break;
    case v1::CoordinatorMessage::kShardRef:
      s = TakeShardRef(msg.shard_ref());
      break;
    case v1::CoordinatorMessage::kCommit:
      item.kind = InboxItem::kCommit;
      item.step = msg.commit().step();
      item.epoch = msg.commit().membership_epoch();
      item.checkpoint = msg.commit().checkpoint();
      queue_.Push(std::move(item));
      break;
    case v1::CoordinatorMessage::kReform:
      if (a.remaining != 0) {
        s = absl::DataLossError("a Reform arrived inside a microbatch");
        break;
      }
      NewEpoch(msg.reform().membership_epoch());
      item.kind = InboxItem::kReform;
      item.reform = msg.reform();
      queue_.Push(std::move(item));
      break;
    case v1::CoordinatorMessage::kShutdown:
      newest_epoch_ = kSessionOver;
      item.kind = InboxItem::kShutdown;
      item.text = msg.shutdown().reason();
      item.job_finished = msg.shutdown().job_finished();
      queue_.Push(std::move(item));
      return false;
    default:  // a newer coordinator's message this worker does not know
      break;
  }
  if (!s.ok()) Fail(std::string(s.message()));
  return s.ok();
}

absl::Status SessionInbox::TakeShardRef(const v1::ShardRef& ref) {
  if (stream_.remaining != 0) return absl::DataLossError("a ShardRef arrived inside a microbatch");
  if (fetcher_ != nullptr) {
    refs_.Push(ref);
    return absl::OkStatus();
  }
  // It cannot be fetched: the step is reported, and sent again.
  InboxItem lost;
  lost.kind = InboxItem::kShardLost;
  lost.step = ref.step();
  lost.epoch = ref.membership_epoch();
  lost.text = "this worker has no feeder client";
  queue_.Push(std::move(lost));
  return absl::OkStatus();
}

void SessionInbox::NewEpoch(uint64_t epoch) {
  absl::MutexLock lock(&fetch_mu_);
  newest_epoch_ = std::max<uint64_t>(newest_epoch_, epoch);
  if (active_fetch_ != nullptr && active_epoch_ < newest_epoch_) active_fetch_->TryCancel();
}

void SessionInbox::FetchLoop() {
  while (std::optional<v1::ShardRef> ref = refs_.Pop()) FetchShard(*ref);
}

void SessionInbox::FetchShard(const v1::ShardRef& ref) {
  grpc::ClientContext ctx;
  {
    absl::MutexLock lock(&fetch_mu_);
    // Superseded (a newer epoch sends it again) or the session is over: nothing to do.
    if (fetching_stopped_ || ref.membership_epoch() < newest_epoch_) return;
    active_fetch_ = &ctx;
    active_epoch_ = ref.membership_epoch();
  }
  bool header_seen = false, pushed = false;
  const absl::Status fetched = fetcher_->Fetch(ref, &ctx, [&](const grpc::ByteBuffer& buffer) {
    if (metrics_ != nullptr) metrics_->AddReceivedBytes(buffer.Length());
    const absl::Status s = TakeFetched(buffer, ref, header_seen, &pushed);
    if (!s.ok()) LOG(WARNING) << "shard " << ref.shard() << " of step " << ref.step() << ": " << s;
    return s.ok();
  });
  {
    absl::MutexLock lock(&fetch_mu_);
    active_fetch_ = nullptr;
  }
  if (pushed) return;  // whole and queued: how the call ended changes nothing
  fetched_.remaining = 0;
  fetched_.pending = InboxItem();
  fetched_.assembler.Reset();
  if (ref.membership_epoch() < newest_epoch_) return;  // cancelled by a Reform
  InboxItem lost;
  lost.kind = InboxItem::kShardLost;
  lost.step = ref.step();
  lost.epoch = ref.membership_epoch();
  lost.text = fetched.ok() ? "the feeder's answer ended before the shard was whole"
                           : std::string(fetched.message());
  queue_.Push(std::move(lost));
}

absl::Status SessionInbox::TakeFetched(const grpc::ByteBuffer& buffer, const v1::ShardRef& ref,
                                       bool& header_seen, bool* pushed) {
  Assembly& a = fetched_;
  if (ParseChunkBuffer(buffer, kCoordinatorMessageChunkField, &a.chunk)) {
    return AddChunk(
        a, [&](TensorAssembler& t) { return t.Add(a.chunk.header, a.chunk.data); }, pushed);
  }
  v1::CoordinatorMessage& msg = a.message;
  if (!BufferToMessage(buffer, &msg)) return absl::DataLossError("a malformed message");
  if (msg.kind_case() == v1::CoordinatorMessage::kTensorChunk) {
    return AddChunk(
        a, [&](TensorAssembler& t) { return t.Add(msg.tensor_chunk()); }, pushed);
  }
  const v1::Microbatch& h = msg.microbatch();
  if (msg.kind_case() != v1::CoordinatorMessage::kMicrobatch || h.step() != ref.step() ||
      h.shard() != ref.shard() || h.membership_epoch() != ref.membership_epoch() || header_seen) {
    return absl::DataLossError("not the header of the shard asked for");
  }
  header_seen = true;
  return BeginBatch(a, h, pushed);
}

void SessionInbox::StopFetching() {
  {
    absl::MutexLock lock(&fetch_mu_);
    fetching_stopped_ = true;
    if (active_fetch_ != nullptr) active_fetch_->TryCancel();
  }
  refs_.Close();
}

void SessionInbox::ReadAll(CoordinatorLink& link) {
  std::thread fetching;
  if (fetcher_ != nullptr) fetching = std::thread([this] { FetchLoop(); });
  grpc::ByteBuffer buffer;
  bool more = true;
  while (more && link.Read(&buffer)) {
    if (metrics_ != nullptr) metrics_->AddReceivedBytes(buffer.Length());
    more = Take(buffer);
  }
  if (more) Fail("the coordinator closed the Train stream");
  StopFetching();
  if (fetching.joinable()) fetching.join();
}

}  // namespace flashdraft
