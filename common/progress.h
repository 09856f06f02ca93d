// Progress of a long command (make-tiny-target, prepare, eval) or of a long step of a daemon (the
// online target's tokenization, a large checkpoint write), told the way its reader sees it: on a
// terminal a bar redrawn in place with the rate and the time left,
//
//   prepare  [#########...............]  38%  1.2 MiB/3.1 MiB  410 KiB/s  ETA 0:05  982 samples
//
// and elsewhere (a pipe, launch's prefixed logs, a log file) a plain line every interval:
//
//   prepare: 38% (1.2 MiB of 3.1 MiB, 410 KiB/s, ETA 0:05) 982 samples
//
// Time comes from a Clock, so tests drive it with a FakeClock. Not thread-safe: one owner.
#pragma once

#include <cstdio>
#include <functional>
#include <string>

#include "common/clock.h"

namespace flashdraft {

class Progress {
 public:
  // Receives the text to show: `in_place` text replaces the line before it (a bar), other text is
  // a line of its own. No newline at its end either way.
  using Sink = std::function<void(const std::string& text, bool in_place)>;

  // `total` of `unit` ("B" shows bytes in KiB/MiB/GiB; 0: unknown, no percentage or ETA).
  // `bar`: redraw in place (at most every 0.1 s); otherwise a line every `interval_seconds`.
  Progress(std::string label, double total, std::string unit, bool bar, double interval_seconds,
           Sink sink, const Clock& clock = RealClock::Get());

  // For a command: a bar on `out` when it is a terminal, else a line every 10 s.
  static Progress ForStream(std::string label, double total, std::string unit, FILE* out = stderr);
  // For a daemon: a line every 10 s into its log (glog INFO), none when it ends within that.
  static Progress ForLog(std::string label, double total, std::string unit);

  // `done` of the total so far, and a short note (e.g. "loss 3.21").
  void Update(double done, const std::string& note = "");
  // The last state: a bar is drawn a last time and ends its line; a plain line is written when
  // any was before (or with `always`), so a daemon's quick task leaves no trace in its log.
  void Finish(const std::string& note = "", bool always = false);

  // "1.5 MiB", "12 steps" — exposed for tests.
  static std::string Amount(double value, const std::string& unit);
  static std::string Duration(double seconds);  // "0:05", "12:03", "1:02:03"

 private:
  std::string Text(bool as_bar) const;

  std::string label_, unit_;
  double total_;
  bool bar_;
  double interval_;
  Sink sink_;
  const Clock& clock_;
  double start_, last_shown_ = -1;
  double done_ = 0;
  std::string note_;
  bool shown_ = false, finished_ = false;
};

}  // namespace flashdraft
