// How a request to stop reaches `flashdraft launch`'s Supervisor: SIGINT or SIGTERM to the launcher
// in the real program, a test's hand in tests.
#pragma once

namespace flashdraft {

class StopSignal {
 public:
  virtual ~StopSignal() = default;
  // The signal that asked to stop, 0 while none did.
  virtual int Received() const = 0;
};

// SIGINT and SIGTERM to this process, from Install() on. The handler only stores the signal's
// number (all a POSIX handler may safely do); Received() reads it.
class TerminationSignals : public StopSignal {
 public:
  static void Install();
  int Received() const override;
};

}  // namespace flashdraft
