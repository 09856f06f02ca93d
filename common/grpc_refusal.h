// A callback-API streaming call answered at once with a status (unauthenticated, malformed): the
// reactor a method returns instead of serving it; it deletes itself when the call is done.
#pragma once

#include <grpcpp/support/status.h>

#include <utility>

namespace flashdraft {

template <typename Reactor>
struct Refusal : Reactor {
  explicit Refusal(grpc::Status status) { this->Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace flashdraft
