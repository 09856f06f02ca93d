// The workers' Train streams by session token (WorkerChannels over gRPC reactors). A stream is
// opened unbound; its first message binds it to a token (MembershipController::Bind attaches it);
// it is forgotten when it ends or is closed. Its own lock, taken after MembershipController's and
// before a stream's write lock; it never calls back into the controller.
#pragma once

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coordinator/worker_channels.h"

namespace flashdraft {

class TrainSession;  // coordinator/service.h

class StreamRegistry : public WorkerChannels {
 public:
  explicit StreamRegistry(const Clock& clock) : clock_(clock) {}

  // A Train stream opened (not bound yet).
  void Opened(TrainSession* session);
  // Binds `session` to `token` (its first message was accepted).
  void Attach(TrainSession* session, const std::string& token);
  // The stream is over (its reactor is done): forgotten. Returns the token it was bound to (empty:
  // none).
  std::string Ended(TrainSession* session);

  bool Send(const std::string& token, grpc::ByteBuffer message) override;
  void Close(const std::string& token, const grpc::Status& status,
             const grpc::ByteBuffer* last = nullptr) override;
  void CloseAll(const grpc::Status& status, const grpc::ByteBuffer* last = nullptr) override;
  double CloseUnbound(double now, double timeout_seconds) override;

 private:
  const Clock& clock_;
  absl::Mutex mu_;
  std::map<std::string, TrainSession*> bound_ ABSL_GUARDED_BY(mu_);  // by token
  std::map<TrainSession*, double> unbound_ ABSL_GUARDED_BY(mu_);     // -> when it opened
};

}  // namespace flashdraft
