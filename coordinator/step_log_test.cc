#include "coordinator/step_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::TempDir;

std::vector<nlohmann::json> Lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  absl::StatusOr<std::string> text = ReadFile(path);
  EXPECT_TRUE(text.ok());
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

StepRecord Record(uint64_t step) {
  StepRecord r;
  r.step = step;
  r.loss = 1.0 / static_cast<double>(step + 1);
  r.world_size = 2;
  r.slot_correct = {1, 0};
  r.slot_total = {2, 2};
  return r;
}

TEST(StepLogTest, WritesRecordsAndEventsLineByLine) {
  TempDir dir;
  const std::string path = dir.Join("steps.jsonl");
  absl::StatusOr<StepLog> log = StepLog::Open(path);
  ASSERT_TRUE(log.ok()) << log.status();
  log->WriteEvent({{"event", "membership"}, {"membership_epoch", 1}});
  log->Write(Record(0));
  // Flushed at once: readable while the log is open.
  const std::vector<nlohmann::json> lines = Lines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["event"], "membership");
  EXPECT_EQ(lines[1]["step"], 0);
  EXPECT_EQ(lines[1]["world_size"], 2);
  EXPECT_DOUBLE_EQ(lines[1]["slot_accuracy"][0].get<double>(), 0.5);
  EXPECT_TRUE(lines[1].contains("unix_time"));
}

TEST(StepLogTest, ResumingKeepsTheStepsTheCheckpointHolds) {
  TempDir dir;
  const std::string path = dir.Join("steps.jsonl");
  {
    absl::StatusOr<StepLog> log = StepLog::Open(path);
    ASSERT_TRUE(log.ok());
    for (uint64_t s = 0; s < 5; ++s) {
      log->Write(Record(s));
      if (s == 3) log->WriteEvent({{"event", "membership"}, {"world_size", 2}});
    }
  }
  absl::StatusOr<StepLog> log = StepLog::Open(path, /*resume_step=*/3);
  ASSERT_TRUE(log.ok());
  log->Write(Record(3));
  const std::vector<nlohmann::json> lines = Lines(path);
  ASSERT_EQ(lines.size(), 6u);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(lines[s]["step"], s);
  // The event of a step trained again stays: it happened.
  EXPECT_EQ(lines[3]["event"], "membership");
  EXPECT_EQ(lines[4]["event"], "resumed");
  EXPECT_EQ(lines[4]["next_step"], 3);
  EXPECT_EQ(lines[5]["step"], 3);
  // A fresh log starts empty.
  ASSERT_TRUE(StepLog::Open(path).ok());
  EXPECT_TRUE(Lines(path).empty());
}

}  // namespace
}  // namespace flashdraft
