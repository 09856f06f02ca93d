#include "model/memory_estimate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

// Qwen3-8B's shape, two layers, online.
MemoryInputs Qwen3_8b() {
  MemoryInputs in;
  in.online_target = true;
  TargetModelConfig& t = in.target;
  t.model_type = "qwen3";
  t.qk_norm = true;
  t.hidden_size = 4096;
  t.intermediate_size = 12288;
  t.num_hidden_layers = 2;
  t.num_attention_heads = 32;
  t.num_key_value_heads = 8;
  t.head_dim = 128;
  t.vocab_size = 151936;
  in.drafter = DrafterConfigForTarget(t, {0, 1}, 2048, -1);
  return in;
}

int64_t Part(const ProcessMemory& p, const std::string& prefix) {
  for (const MemoryPart& part : p.parts) {
    if (part.what.rfind(prefix, 0) == 0) return part.bytes;
  }
  return -1;
}

TEST(MemoryEstimateTest, PartsFollowTheJobsShapes) {
  JobConfig job;
  job.data.source = "target";
  job.data.max_seq_len = 2048;
  job.drafter.num_hidden_layers = 1;
  job.drafter.max_anchors = 64;
  job.train.global_batch_size = 2;
  const MemoryInputs in = Qwen3_8b();
  const JobMemory m = EstimateJobMemory(job, in, 2);
  // Untied embeddings and lm_head of 151,936 x 4096 in fp32 on every worker: 4.6 GiB.
  EXPECT_EQ(Part(m.worker, "frozen embeddings"), int64_t{2} * 151936 * 4096 * 4);
  EXPECT_EQ(Part(m.coordinator, "target weights (fp32)"), TargetParameterCount(in.target) * 4);
  // Twice the anchors: more activations; twice the sequence: more target forward; the
  // parameters' parts unchanged.
  job.drafter.max_anchors = 128;
  const JobMemory anchors = EstimateJobMemory(job, in, 2);
  EXPECT_GT(Part(anchors.worker, "activations"), Part(m.worker, "activations"));
  EXPECT_EQ(Part(anchors.worker, "drafter weights"), Part(m.worker, "drafter weights"));
  job.data.max_seq_len = 4096;
  EXPECT_GT(Part(EstimateJobMemory(job, in, 2).coordinator, "target forward"),
            Part(anchors.coordinator, "target forward"));
  // More workers split the batch: less per worker.
  job.train.global_batch_size = 8;
  EXPECT_LT(Part(EstimateJobMemory(job, in, 8).worker, "activations"),
            Part(EstimateJobMemory(job, in, 1).worker, "activations"));
  const std::string table = FormatJobMemory(m);
  EXPECT_THAT(table, HasSubstr("# coordinator: expected peak "));
  EXPECT_THAT(table, HasSubstr("# each of 2 worker(s): expected peak "));
  EXPECT_THAT(table, HasSubstr("frozen embeddings and lm_head (fp32)"));
}

// Distillation: the target's final hidden state travels with the features (H more per token of
// n·H, here 2·H) and its forward runs to the last layer; the loss chunk holds fewer rows.
TEST(MemoryEstimateTest, DistillationCountsTheTeacherFeature) {
  JobConfig job;
  job.data.source = "target";
  job.data.max_seq_len = 2048;
  job.drafter.max_anchors = 64;
  const MemoryInputs in = Qwen3_8b();
  const JobMemory ce = EstimateJobMemory(job, in, 2);
  job.train.loss = "kl";
  const JobMemory kl = EstimateJobMemory(job, in, 2);
  EXPECT_EQ(Part(kl.worker, "received features") * 2, Part(ce.worker, "received features") * 3);
  EXPECT_EQ(Part(kl.coordinator, "prefetched features") * 2,
            Part(ce.coordinator, "prefetched features") * 3);
  EXPECT_GT(Part(kl.coordinator, "target forward"), Part(ce.coordinator, "target forward"));
  // A loss chunk of 128 rows instead of 256 at this vocabulary, and the teacher's rows.
  const int64_t rows = 16 * 64 * 16;  // (32 + 1) / 2 samples x max_anchors x block_size
  EXPECT_EQ(
      Part(kl.worker, "attention and loss chunks") - Part(ce.worker, "attention and loss chunks"),
      3 * (128 - 256) * int64_t{151936} * 4 + rows * 4096 * 4);
}

TEST(MemoryEstimateTest, AJobThatCannotFitIsRefusedNamingTheLargestPart) {
  JobConfig job;
  job.data.source = "target";
  job.data.max_seq_len = 2048;
  job.drafter.max_anchors = 64;
  const JobMemory m = EstimateJobMemory(job, Qwen3_8b(), 4);
  const int64_t total = m.coordinator.HostBytes() + 4 * m.worker.HostBytes();
  EXPECT_TRUE(CheckJobFits(m, total, "this machine").ok());
  EXPECT_TRUE(CheckJobFits(m, 0, "this machine").ok());  // unknown: no refusal
  const absl::Status s = CheckJobFits(m, total - 1, "this machine");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("the largest part is the worker's checkpoint upload (rank 0)"));
  EXPECT_GT(AvailableHostMemory(), 0);
}

TEST(MemoryEstimateTest, FeedersHoldTheTargetAndTheCoordinatorNoFeatures) {
  JobConfig job;
  job.data.source = "target";
  job.data.max_seq_len = 2048;
  job.data.regenerate = true;
  job.drafter.max_anchors = 64;
  const MemoryInputs in = Qwen3_8b();
  const JobMemory alone = EstimateJobMemory(job, in, 2);
  EXPECT_EQ(alone.feeders, 0);
  EXPECT_TRUE(alone.feeder.parts.empty());
  EXPECT_GT(Part(alone.coordinator, "prefetched features"), 0);
  const JobMemory fed = EstimateJobMemory(job, in, 2, 3);
  EXPECT_EQ(Part(fed.coordinator, "prefetched features"), -1);
  // The feeders run the target: the coordinator loads its embedding and lm_head, and runs no
  // target forward but to evaluate.
  EXPECT_EQ(Part(fed.coordinator, "target weights"), -1);
  EXPECT_EQ(Part(fed.coordinator, "target embedding and lm_head"),
            2 * in.target.vocab_size * in.target.hidden_size * 4);
  EXPECT_EQ(Part(fed.coordinator, "target forward"), -1);
  EXPECT_EQ(Part(fed.coordinator, "KV cache"), -1);
  EXPECT_GT(Part(EstimateJobMemory(job, in, 2, 0).coordinator, "target forward"), 0);
  job.eval.every_steps = 100;
  EXPECT_GT(Part(EstimateJobMemory(job, in, 2, 3).coordinator, "KV cache"), 0);
  job.eval.every_steps = 0;
  job.data.regenerate = false;
  EXPECT_EQ(Part(EstimateJobMemory(job, in, 2, 3).feeder, "KV cache"), -1);
  job.data.regenerate = true;
  EXPECT_EQ(Part(fed.feeder, "target weights (fp32)"), TargetParameterCount(in.target) * 4);
  EXPECT_GT(Part(fed.feeder, "target forward"), 0);
  EXPECT_GT(Part(fed.feeder, "KV cache"), 0);  // the feeders regenerate the replies
  EXPECT_EQ(Part(fed.feeder, "computed features held"),
            std::min(kDefaultFeederMaxBytes, Part(alone.coordinator, "prefetched features")));
  // A feeder's --max-bytes bounds what it holds, whichever way.
  const int64_t window = Part(alone.coordinator, "prefetched features");
  EXPECT_EQ(Part(EstimateJobMemory(job, in, 2, 3, 1 << 20).feeder, "computed features held"),
            std::min<int64_t>(1 << 20, window));
  EXPECT_EQ(
      Part(EstimateJobMemory(job, in, 2, 3, int64_t{1} << 50).feeder, "computed features held"),
      window);
  EXPECT_EQ(fed.TotalHostBytes(),
            fed.coordinator.HostBytes() + 2 * fed.worker.HostBytes() + 3 * fed.feeder.HostBytes());
  EXPECT_THAT(FormatJobMemory(fed), HasSubstr("# each of 3 feeder(s): expected peak "));
  // Twelve feeders of an 8B target outweigh everything else: the refusal names the feeder.
  const JobMemory many = EstimateJobMemory(job, in, 1, 12);
  const absl::Status s = CheckJobFits(many, many.TotalHostBytes() - 1, "this machine");
  EXPECT_THAT(std::string(s.message()), HasSubstr("12 feeder(s) of"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("the largest part is the feeder's target weights"));
  // A feeder checking its own host counts only itself (as feeder.cc does).
  JobMemory one = EstimateJobMemory(job, in, 1, 1);
  one.coordinator.parts.clear();
  one.workers = 0;
  const absl::Status alone_refused = CheckJobFits(one, one.feeder.HostBytes() - 1, "this host");
  EXPECT_THAT(std::string(alone_refused.message()), HasSubstr(" of memory (1 feeder(s) of "));
  EXPECT_THAT(std::string(alone_refused.message()), ::testing::Not(HasSubstr("0 worker(s)")));
  EXPECT_THAT(std::string(alone_refused.message()), ::testing::Not(HasSubstr("coordinator 0")));
  // Shards (no online target): no feeders whatever is asked.
  MemoryInputs offline = in;
  offline.online_target = false;
  EXPECT_EQ(EstimateJobMemory(job, offline, 2, 3).feeders, 0);
}

TEST(MemoryEstimateTest, MissingFilesAreNamed) {
  testing::TempDir dir;
  JobConfig job;
  job.data.source = "target";
  job.target.path = dir.Join("nowhere");
  EXPECT_THAT(std::string(MemoryInputsForJob(job).status().message()),
              HasSubstr("nowhere/config.json"));
  job.data.source = "shards";
  job.data.shards_dir = dir.path();
  ASSERT_TRUE(WriteFileAtomically(dir.Join("manifest.json"), "{\"metadata\": {}}").ok());
  EXPECT_THAT(std::string(MemoryInputsForJob(job).status().message()),
              HasSubstr("manifest.json: no metadata.drafter_config"));
}

}  // namespace
}  // namespace flashdraft
