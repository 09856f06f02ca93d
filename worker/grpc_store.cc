#include "worker/grpc_store.h"

#include <grpcpp/grpcpp.h>

#include <thread>

namespace flashdraft {
namespace {

// Polls `ready` with backoff (1 ms doubling to 50 ms) until it holds or `timeout` passes.
template <typename Ready>
void PollUntil(Ready ready, std::chrono::milliseconds timeout, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      TORCH_CHECK(false, "GrpcStore: timed out after ", timeout.count(), " ms waiting for ", what);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace

GrpcStore::GrpcStore(std::shared_ptr<v1::Coordinator::Stub> stub, std::string session_token,
                     std::chrono::milliseconds timeout)
    : c10d::Store(timeout), stub_(std::move(stub)), token_(std::move(session_token)) {}

v1::StoreReply GrpcStore::Call(v1::StoreRequest request) {
  request.set_session_token(token_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::StoreReply reply;
  grpc::Status status = stub_->Store(&ctx, request, &reply);
  TORCH_CHECK(status.ok(), "GrpcStore: ", status.error_message());
  return reply;
}

void GrpcStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  v1::StoreRequest r;
  r.mutable_set()->set_key(key);
  r.mutable_set()->set_value(std::string(value.begin(), value.end()));
  Call(std::move(r));
}

std::vector<uint8_t> GrpcStore::get(const std::string& key) {
  v1::StoreReply reply;
  PollUntil(
      [&] {
        v1::StoreRequest r;
        r.mutable_get()->set_key(key);
        reply = Call(std::move(r));
        return reply.ready();
      },
      timeout_, "key '" + key + "'");
  return std::vector<uint8_t>(reply.value().begin(), reply.value().end());
}

int64_t GrpcStore::add(const std::string& key, int64_t value) {
  v1::StoreRequest r;
  r.mutable_add()->set_key(key);
  r.mutable_add()->set_delta(value);
  return Call(std::move(r)).counter();
}

bool GrpcStore::deleteKey(const std::string& key) {
  v1::StoreRequest r;
  r.mutable_delete_key()->set_key(key);
  return Call(std::move(r)).deleted();
}

bool GrpcStore::check(const std::vector<std::string>& keys) {
  v1::StoreRequest r;
  for (const auto& k : keys) r.mutable_check()->add_keys(k);
  return Call(std::move(r)).ready();
}

int64_t GrpcStore::getNumKeys() {
  v1::StoreRequest r;
  r.set_num_keys(true);
  return Call(std::move(r)).counter();
}

void GrpcStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GrpcStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  PollUntil([&] { return check(keys); }, timeout, std::to_string(keys.size()) + " key(s)");
}

#if FLASHDRAFT_STORE_HAS_CLONE
c10::intrusive_ptr<c10d::Store> GrpcStore::clone() {
  return c10::make_intrusive<GrpcStore>(stub_, token_, timeout_);
}
#endif

}  // namespace flashdraft
