#include "worker/feeder_client.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/raw_client_stream.h"
#include "common/security.h"
#include "flashdraft/v1/feeder.pb.h"

namespace flashdraft {

absl::StatusOr<std::shared_ptr<grpc::Channel>> FeederClient::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(address);
  if (it != channels_.end()) return it->second;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateSecureChannel(address, security_);
  if (channel.ok()) channels_[address] = *channel;
  return channel;
}

absl::Status FeederClient::Fetch(const v1::ShardRef& ref, grpc::ClientContext* ctx,
                                 const std::function<bool(const grpc::ByteBuffer&)>& on_message) {
  const std::string what = absl::StrCat("shard ", ref.shard(), " of step ", ref.step(),
                                        " from feeder ", Untrusted(ref.feeder_address()));
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ChannelTo(ref.feeder_address());
  if (!channel.ok())
    return absl::UnavailableError(absl::StrCat(what, ": ", channel.status().message()));
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds_ * 1000)));
  RawClientStream call(*channel, "/flashdraft.v1.Feeder/FetchShard", ctx);
  v1::FetchShardRequest request;
  request.set_ticket(ref.ticket());
  request.set_step(ref.step());
  bool stopped = false;
  if (call.Write(MessageToBuffer(request))) {
    call.WritesDone();
    grpc::ByteBuffer message;
    while (call.Read(&message)) {
      if (!on_message(message)) {
        stopped = true;
        ctx->TryCancel();
        break;
      }
    }
  }
  const grpc::Status status = call.Finish();
  if (stopped) return absl::DataLossError(absl::StrCat(what, ": it sent what this shard is not"));
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat(what, ": ", status.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace flashdraft
