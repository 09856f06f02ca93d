#include "common/grpc_options.h"

#include <utility>

#include "common/tensor_codec.h"

namespace flashdraft {
namespace {

static_assert(kDefaultMaxChunkBytes + (32 << 10) <= kMaxServerReceiveBytes,
              "a checkpoint chunk and its header must fit what the coordinator accepts");

// Both ends ping and accept pings the same way.
constexpr std::pair<const char*, int> kKeepalive[] = {
    {GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveSeconds * 1000},
    {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutSeconds * 1000},
    {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1},
    {GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0},
};

}  // namespace

grpc::ChannelArguments ClientChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  for (const auto& [key, value] : kKeepalive) args.SetInt(key, value);
  return args;
}

void ConfigureServer(grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(kMaxServerReceiveBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  for (const auto& [key, value] : kKeepalive) builder.AddChannelArgument(key, value);
  // Clients ping this often; without this the server answers them with GOAWAY (too_many_pings).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kKeepaliveSeconds * 1000 / 2);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

}  // namespace flashdraft
