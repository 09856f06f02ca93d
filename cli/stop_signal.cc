#include "cli/stop_signal.h"

#include <signal.h>

#include <atomic>

namespace flashdraft {
namespace {

// The one place a signal handler can reach: lock-free, so safe to store from it.
std::atomic<int> received_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

void OnTerminationSignal(int signal) { received_signal.store(signal); }

}  // namespace

void TerminationSignals::Install() {
  struct sigaction sa {};
  sa.sa_handler = OnTerminationSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int TerminationSignals::Received() const { return received_signal.load(); }

}  // namespace flashdraft
