// ThreadSanitizer annotations for Debian's uninstrumented gRPC core (linked into every executable
// of a -DFLASHDRAFT_TSAN=ON build, nowhere else).
//
// gRPC's C++ API is inline header code, compiled into our instrumented objects: a thread that
// starts an operation (StartWrite, StartRead, a unary call) fills a CallOpSet there and hands it to
// grpc_call_start_batch with a tag; the thread that completes it takes the tag off a completion
// queue and finishes the CallOpSet, again in header code. The handoff in between runs through gRPC
// core's lock-free queues, which TSan cannot see, so each such pair would be reported as a race on
// gRPC's own bookkeeping (and our buffers handed over with it). These definitions interpose on
// libgrpc's exported functions (libgrpc++ and our code call them through the PLT) and publish the
// handoff: a release on the tag when an operation starts, an acquire on it when the tag comes off
// the queue. gRPC 1.51 on Debian completes callback-API operations on its "nexting" thread, which
// takes them off a queue with grpc_completion_queue_next; the synchronous API plucks them.
//
// A server's Shutdown waits until every call has dropped its reference to the server, an atomic
// reference count in libgrpc++: after it returns, the service's state may be destroyed although
// the calls' last callbacks (OnDone) ran on other threads. Each reference dropped is published as
// a release on the server, and the wait as an acquire. (Both are exported and called through the
// PLT, also from within libgrpc++.)
//
// A server call's OnDone runs once the call's count of outstanding callbacks drops to zero,
// usually on an executor thread. The decrements in gRPC's inline headers (our objects) release on
// the counter, those inside libgrpc++ are invisible; ScheduleOnDone, which hands OnDone to the
// executor (under an annotated absl::Mutex), first acquires the counter.
#include <dlfcn.h>
#include <grpc/grpc.h>
#include <grpcpp/server.h>
#include <grpcpp/support/server_callback.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

namespace {

template <typename Fn>
Fn Real(const char* name) {
  void* fn = dlsym(RTLD_NEXT, name);
  if (fn == nullptr) {
    std::fprintf(stderr, "grpc_annotations: %s not found in libgrpc or libgrpc++\n", name);
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

grpc_event Completed(grpc_event event) {
  if (event.type == GRPC_OP_COMPLETE && event.tag != nullptr) __tsan_acquire(event.tag);
  return event;
}

}  // namespace

extern "C" {

grpc_call_error grpc_call_start_batch(grpc_call* call, const grpc_op* ops, size_t nops, void* tag,
                                      void* reserved) {
  static const auto real =
      Real<grpc_call_error (*)(grpc_call*, const grpc_op*, size_t, void*, void*)>(
          "grpc_call_start_batch");
  if (tag != nullptr) __tsan_release(tag);
  return real(call, ops, nops, tag, reserved);
}

grpc_event grpc_completion_queue_next(grpc_completion_queue* cq, gpr_timespec deadline,
                                      void* reserved) {
  static const auto real = Real<grpc_event (*)(grpc_completion_queue*, gpr_timespec, void*)>(
      "grpc_completion_queue_next");
  return Completed(real(cq, deadline, reserved));
}

grpc_event grpc_completion_queue_pluck(grpc_completion_queue* cq, void* tag, gpr_timespec deadline,
                                       void* reserved) {
  static const auto real = Real<grpc_event (*)(grpc_completion_queue*, void*, gpr_timespec, void*)>(
      "grpc_completion_queue_pluck");
  return Completed(real(cq, tag, deadline, reserved));
}

}  // extern "C"

namespace grpc {

void Server::UnrefWithPossibleNotify() {
  static const auto real = Real<void (*)(Server*)>("_ZN4grpc6Server23UnrefWithPossibleNotifyEv");
  __tsan_release(this);
  real(this);
}

void Server::UnrefAndWaitLocked() {
  static const auto real = Real<void (*)(Server*)>("_ZN4grpc6Server18UnrefAndWaitLockedEv");
  real(this);
  __tsan_acquire(this);
}

namespace internal {

void ServerCallbackCall::ScheduleOnDone(bool inline_ondone) {
  static const auto real = Real<void (*)(ServerCallbackCall*, bool)>(
      "_ZN4grpc8internal18ServerCallbackCall14ScheduleOnDoneEb");
  __tsan_acquire(&callbacks_outstanding_);
  real(this, inline_ondone);
}

}  // namespace internal
}  // namespace grpc
