// Channel and server settings every flashdraft gRPC endpoint shares: message size limits and
// HTTP/2 keepalive. Keepalive pings a connection that carried nothing for kKeepaliveSeconds and
// drops it when the ping is not answered within kKeepaliveTimeoutSeconds, so a worker whose
// coordinator vanished (a cut cable, a dead host) learns it in seconds instead of the ~15 min a
// TCP retransmission timeout takes, and the coordinator ends a cut worker's streams the same way.
#pragma once

#include <grpcpp/grpcpp.h>

namespace flashdraft {

inline constexpr int kMaxMessageBytes = 64 << 20;
// What the coordinator accepts in one message: a tensor chunk (kDefaultMaxChunkBytes) and its
// header; every other request is small. Bigger messages are refused before they are buffered.
inline constexpr int kMaxServerReceiveBytes = 4 << 20;
inline constexpr int kKeepaliveSeconds = 5;
inline constexpr int kKeepaliveTimeoutSeconds = 5;

grpc::ChannelArguments ClientChannelArguments();
void ConfigureServer(grpc::ServerBuilder& builder);

}  // namespace flashdraft
