#include "coordinator/stream_registry.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "coordinator/service.h"

namespace flashdraft {

void StreamRegistry::Opened(TrainSession* session) {
  absl::MutexLock lock(&mu_);
  unbound_[session] = clock_.Now();
}

void StreamRegistry::Attach(TrainSession* session, const std::string& token) {
  absl::MutexLock lock(&mu_);
  unbound_.erase(session);
  bound_[token] = session;
}

std::string StreamRegistry::Ended(TrainSession* session) {
  absl::MutexLock lock(&mu_);
  unbound_.erase(session);
  for (auto it = bound_.begin(); it != bound_.end(); ++it) {
    if (it->second == session) {
      std::string token = it->first;
      bound_.erase(it);  // the stream is already over: nothing to finish
      return token;
    }
  }
  return "";
}

bool StreamRegistry::Send(const std::string& token, grpc::ByteBuffer message) {
  absl::MutexLock lock(&mu_);
  auto it = bound_.find(token);
  if (it == bound_.end()) return false;
  it->second->Send(std::move(message));
  return true;
}

void StreamRegistry::Close(const std::string& token, const grpc::Status& status,
                           const grpc::ByteBuffer* last) {
  absl::MutexLock lock(&mu_);
  auto it = bound_.find(token);
  if (it == bound_.end()) return;
  if (last != nullptr) it->second->Send(*last);
  it->second->FinishAfterWrites(status);
  bound_.erase(it);
}

void StreamRegistry::CloseAll(const grpc::Status& status, const grpc::ByteBuffer* last) {
  absl::MutexLock lock(&mu_);
  for (auto& [token, session] : bound_) {
    if (last != nullptr) session->Send(*last);
    session->FinishAfterWrites(status);
  }
  bound_.clear();
}

double StreamRegistry::CloseUnbound(double now, double timeout_seconds) {
  absl::MutexLock lock(&mu_);
  double next = std::numeric_limits<double>::infinity();
  for (auto it = unbound_.begin(); it != unbound_.end();) {
    const double expiry = it->second + timeout_seconds;
    if (now < expiry) {
      next = std::min(next, expiry);
      ++it;
      continue;
    }
    it->first->FinishAfterWrites(grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        absl::StrCat("no first message on the Train stream within ", timeout_seconds, " s")));
    it = unbound_.erase(it);
  }
  return next;
}

}  // namespace flashdraft
