#include "common/progress.h"

#include <unistd.h>

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace flashdraft {

Progress::Progress(std::string label, double total, std::string unit, bool bar,
                   double interval_seconds, Sink sink, const Clock& clock)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      bar_(bar),
      interval_(bar ? 0.1 : interval_seconds),
      sink_(std::move(sink)),
      clock_(clock),
      start_(clock.Now()) {}

Progress Progress::ForStream(std::string label, double total, std::string unit, FILE* out) {
  const bool terminal = isatty(fileno(out)) == 1;
  return Progress(std::move(label), total, std::move(unit), terminal, 10,
                  [out](const std::string& text, bool in_place) {
                    // \033[K clears what a longer line before left behind.
                    std::fputs(in_place ? ("\r" + text + "\033[K").c_str() : (text + "\n").c_str(),
                               out);
                    std::fflush(out);
                  });
}

Progress Progress::ForLog(std::string label, double total, std::string unit) {
  return Progress(std::move(label), total, std::move(unit), /*bar=*/false, 10,
                  [](const std::string& text, bool) { LOG(INFO) << text; });
}

std::string Progress::Amount(double value, const std::string& unit) {
  if (unit == "B") {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (std::fabs(value) >= 1024 && i < 4) {
      value /= 1024;
      ++i;
    }
    return i == 0 ? absl::StrFormat("%.0f B", value) : absl::StrFormat("%.1f %s", value, units[i]);
  }
  const std::string number = value == std::floor(value) && std::fabs(value) < 1e15
                                 ? absl::StrFormat("%.0f", value)
                                 : absl::StrFormat("%.1f", value);
  return unit.empty() ? number : absl::StrCat(number, " ", unit);
}

std::string Progress::Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

std::string Progress::Text(bool as_bar) const {
  const double elapsed = clock_.Now() - start_;
  const double rate = elapsed > 0 ? done_ / elapsed : 0;
  const bool known = total_ > 0;
  const double fraction = known ? std::min(1.0, std::max(0.0, done_ / total_)) : 0;
  // "1.2 MiB/3.1 MiB", "110/200 steps"
  const std::string amount =
      !known   ? Amount(done_, unit_)
      : as_bar ? absl::StrCat(Amount(done_, unit_ == "B" ? unit_ : ""), "/", Amount(total_, unit_))
               : absl::StrCat(Amount(done_, unit_), " of ", Amount(total_, unit_));
  std::string rate_text = rate > 0 ? absl::StrCat(Amount(rate, unit_), "/s") : "";
  if (unit_ != "B" && rate > 0) {  // "12.5 steps/s", with one decimal for slow rates
    rate_text =
        absl::StrCat(rate >= 100 ? absl::StrFormat("%.0f", rate) : absl::StrFormat("%.1f", rate),
                     unit_.empty() ? "" : " ", unit_, "/s");
  }
  const std::string eta = known && rate > 0 && !finished_
                              ? absl::StrCat("ETA ", Duration((total_ - done_) / rate))
                              : absl::StrCat("in ", Duration(elapsed));
  if (as_bar) {
    constexpr int kWidth = 24;
    const int filled = known ? static_cast<int>(fraction * kWidth) : 0;
    std::string text = label_;
    if (known) {
      absl::StrAppend(&text, "  [", std::string(filled, '#'), std::string(kWidth - filled, '.'),
                      "]  ", absl::StrFormat("%3.0f%%", 100 * fraction));
    }
    absl::StrAppend(&text, "  ", amount);
    if (!rate_text.empty()) absl::StrAppend(&text, "  ", rate_text);
    absl::StrAppend(&text, "  ", eta);
    if (!note_.empty()) absl::StrAppend(&text, "  ", note_);
    return text;
  }
  std::string text = absl::StrCat(label_, ": ");
  if (known) absl::StrAppend(&text, absl::StrFormat("%.0f%% ", 100 * fraction));
  absl::StrAppend(&text, "(", amount);
  if (!rate_text.empty()) absl::StrAppend(&text, ", ", rate_text);
  absl::StrAppend(&text, ", ", eta, ")");
  if (!note_.empty()) absl::StrAppend(&text, " ", note_);
  return text;
}

void Progress::Update(double done, const std::string& note) {
  done_ = done;
  note_ = note;
  const double now = clock_.Now();
  // A line the first time after one interval, then every interval.
  const double since = last_shown_ < 0 ? now - start_ : now - last_shown_;
  if (since < interval_) return;
  last_shown_ = now;
  shown_ = true;
  sink_(Text(bar_), bar_);
}

void Progress::Finish(const std::string& note, bool always) {
  if (finished_) return;
  finished_ = true;
  if (!note.empty()) note_ = note;
  if (!bar_ && !shown_ && !always) return;
  if (bar_) {
    sink_(Text(true), true);
    sink_("", false);  // ends the bar's line
  } else {
    sink_(Text(false), false);
  }
}

}  // namespace flashdraft
