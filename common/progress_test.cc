#include "common/progress.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace flashdraft {
namespace {

using ::testing::ElementsAre;

struct Shown {
  std::vector<std::string> lines, redraws;
  Progress::Sink Sink() {
    return [this](const std::string& text, bool in_place) {
      (in_place ? redraws : lines).push_back(text);
    };
  }
};

TEST(ProgressTest, PlainLinesComeEveryIntervalWithRateAndTimeLeft) {
  FakeClock clock;
  Shown shown;
  Progress p("prepare", 4 << 20, "B", /*bar=*/false, 10, shown.Sink(), clock);
  clock.Advance(5);
  p.Update(1 << 20);  // before the first interval: nothing
  EXPECT_TRUE(shown.lines.empty());
  clock.Advance(5);
  p.Update(2 << 20, "982 samples");
  clock.Advance(3);
  p.Update(3 << 20);  // within the interval after the last line: nothing
  clock.Advance(7);
  p.Update(3 << 20);
  p.Finish("1402 samples");
  EXPECT_THAT(shown.lines,
              ElementsAre("prepare: 50% (2.0 MiB of 4.0 MiB, 204.8 KiB/s, ETA 0:10) 982 samples",
                          "prepare: 75% (3.0 MiB of 4.0 MiB, 153.6 KiB/s, ETA 0:07)",
                          "prepare: 75% (3.0 MiB of 4.0 MiB, 153.6 KiB/s, in 0:20) 1402 samples"));
  EXPECT_TRUE(shown.redraws.empty());
}

TEST(ProgressTest, ADaemonsShortTaskLeavesNoLineUnlessAsked) {
  FakeClock clock;
  Shown shown;
  Progress quiet("checkpoint", 100, "B", false, 10, shown.Sink(), clock);
  clock.Advance(2);
  quiet.Update(100);
  quiet.Finish();
  EXPECT_TRUE(shown.lines.empty());
  Progress told("tokenize", 0, "lines", false, 10, shown.Sink(), clock);
  clock.Advance(4);
  told.Update(120);
  told.Finish("", /*always=*/true);
  EXPECT_THAT(shown.lines, ElementsAre("tokenize: (120 lines, 30.0 lines/s, in 0:04)"));
}

TEST(ProgressTest, AQuickCommandStillEndsWithItsBar) {
  FakeClock clock;
  Shown shown;
  Progress p("prepare", 300, "B", /*bar=*/true, 10, shown.Sink(), clock);
  clock.Advance(0.05);
  p.Update(300, "1 samples");
  EXPECT_TRUE(shown.redraws.empty());
  p.Finish();
  EXPECT_THAT(shown.redraws,
              ElementsAre("prepare  [########################]  100%  300 B/300 B  5.9 KiB/s  in "
                          "0:00  1 samples"));
}

TEST(ProgressTest, ABarIsRedrawnInPlaceAtMostTenTimesASecondAndEndsItsLine) {
  FakeClock clock;
  Shown shown;
  Progress p("train", 256, "steps", /*bar=*/true, 10, shown.Sink(), clock);
  for (int step = 1; step <= 128; ++step) {  // 128 steps/s for 1 s
    clock.Advance(1.0 / 128);
    p.Update(step, "loss 2.50");
  }
  EXPECT_GE(shown.redraws.size(), 9u);
  EXPECT_LE(shown.redraws.size(), 10u);
  for (int step = 129; step <= 256; ++step) {  // then 8 steps/s: every update is shown
    clock.Advance(0.125);
    p.Update(step, "loss 2.25");
  }
  const size_t before = shown.redraws.size();
  EXPECT_EQ(shown.redraws[before - 65],  // step 192, 9 s in
            "train  [##################......]   75%  192/256 steps  21.3 steps/s  ETA 0:03  "
            "loss 2.25");
  p.Finish();
  EXPECT_EQ(shown.redraws.size(), before + 1);
  EXPECT_EQ(shown.redraws.back(),
            "train  [########################]  100%  256/256 steps  15.1 steps/s  in 0:17  "
            "loss 2.25");
  EXPECT_THAT(shown.lines, ElementsAre(""));  // the newline after the bar
}

TEST(ProgressTest, AmountsAndDurationsReadNaturally) {
  EXPECT_EQ(Progress::Amount(512, "B"), "512 B");
  EXPECT_EQ(Progress::Amount(1536, "B"), "1.5 KiB");
  EXPECT_EQ(Progress::Amount(3.5 * (1 << 30), "B"), "3.5 GiB");
  EXPECT_EQ(Progress::Amount(12, "steps"), "12 steps");
  EXPECT_EQ(Progress::Amount(2.25, ""), "2.2");
  EXPECT_EQ(Progress::Duration(5), "0:05");
  EXPECT_EQ(Progress::Duration(723), "12:03");
  EXPECT_EQ(Progress::Duration(3723), "1:02:03");
}

}  // namespace
}  // namespace flashdraft
