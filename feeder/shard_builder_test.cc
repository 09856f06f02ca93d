#include "feeder/shard_builder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/chunk_wire.h"
#include "coordinator/scheduler.h"
#include "coordinator/step_encoder.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kFeatures = 6;

// A sample's features as a function of its tokens alone (row t from ids[0..t], as a causal target
// computes them), so that a feeder given only the ids computes the same bytes as the source.
std::vector<uint8_t> FeaturesOf(const std::vector<int64_t>& ids) {
  std::vector<uint8_t> out(ids.size() * kFeatures * 2);
  uint64_t h = 1469598103934665603ull;
  for (size_t t = 0; t < ids.size(); ++t) {
    h = (h ^ static_cast<uint64_t>(ids[t])) * 1099511628211ull;
    for (int64_t j = 0; j < kFeatures * 2; ++j) out[t * kFeatures * 2 + j] = (h >> (j % 8)) & 0xff;
  }
  return out;
}

// Samples of 9..40 tokens (some beyond max_seq_len), loss on every other token.
class IdSource : public HiddenStateSource {
 public:
  explicit IdSource(uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) {
      std::vector<int64_t> ids;
      for (uint64_t t = 0; t < 9 + (i * 7) % 32; ++t)
        ids.push_back(static_cast<int64_t>(i * 31 + t) % 97);
      ids_.push_back(ids);
      features_.push_back(FeaturesOf(ids));
    }
  }
  uint64_t num_samples() const override { return ids_.size(); }
  int64_t feature_size() const override { return kFeatures; }
  DType feature_dtype() const override { return DType::kBF16; }
  int64_t SampleLength(uint64_t i) const override { return static_cast<int64_t>(ids_[i].size()); }
  absl::StatusOr<Sample> GetTokens(uint64_t i) const override {
    Sample s;
    s.index = i;
    s.input_ids = ids_[i];
    for (size_t t = 0; t < ids_[i].size(); ++t) s.loss_mask.push_back(t % 2 == 1 ? 1 : 0);
    s.feature_dtype = DType::kBF16;
    return s;
  }
  absl::StatusOr<Sample> Get(uint64_t i) const override {
    Sample s = *GetTokens(i);
    s.features = features_[i].data();
    return s;
  }

 private:
  std::vector<std::vector<int64_t>> ids_;
  std::vector<std::vector<uint8_t>> features_;
};

std::string Bytes(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

SchedulerOptions Options() {
  SchedulerOptions o;
  o.seed = 7;
  o.global_batch_size = 6;
  o.block_size = 4;
  o.max_anchors = 5;
  o.max_seq_len = 24;
  o.virtual_shards = 3;
  return o;
}

const FeatureLayout kLayout{kFeatures, DType::kBF16, 24};

ComputeFeatures Compute() {
  return [](const std::vector<int64_t>& ids) -> absl::StatusOr<std::vector<uint8_t>> {
    return FeaturesOf(ids);
  };
}

TEST(ShardBuilderTest, AFeedersShardIsTheInProcessShardBitForBit) {
  IdSource source(40);
  Scheduler scheduler(source, Options());
  for (uint64_t step = 0; step < 4; ++step) {
    const StepPlan plan = scheduler.Plan(step, /*world_size=*/2);
    for (int64_t shard = 0; shard < 3; ++shard) {
      const ShardAddress to{/*membership_epoch=*/3, /*rank=*/shard < plan.shard_offsets[1] ? 0 : 1,
                            /*world_size=*/2, /*learning_rate=*/1e-3};
      std::vector<grpc::ByteBuffer> in_process;
      ASSERT_TRUE(EncodeShard(plan, shard, to, source, scheduler, &in_process).ok());
      absl::StatusOr<v1::ShardWork> work = MakeShardWork(plan, shard, to, source, scheduler, "t");
      ASSERT_TRUE(work.ok()) << work.status();
      absl::StatusOr<std::vector<grpc::ByteBuffer>> chunks = BuildShard(*work, kLayout, Compute());
      ASSERT_TRUE(chunks.ok()) << chunks.status();
      v1::CoordinatorMessage header;
      *header.mutable_microbatch() = work->header();
      ASSERT_EQ(in_process.size(), 1 + chunks->size()) << "step " << step << " shard " << shard;
      EXPECT_EQ(Bytes(in_process[0]), Bytes(MessageToBuffer(header)));
      for (size_t i = 0; i < chunks->size(); ++i) {
        EXPECT_EQ(Bytes(in_process[i + 1]), Bytes((*chunks)[i])) << "message " << i + 1;
      }
      // What the budget counts: the hidden_states tensor.
      int64_t s = 1;
      for (int64_t len : plan.shards[shard].lengths) s = std::max(s, len);
      EXPECT_EQ(*ShardFeatureBytes(*work, kLayout),
                plan.shards[shard].samples.size() * s * kFeatures * 2);
    }
  }
}

v1::ShardWork OneSample(std::vector<int64_t> ids, uint32_t length, std::string mask,
                        std::vector<int64_t> anchors) {
  v1::ShardWork work;
  work.set_ticket("t1");
  work.mutable_header()->set_step(2);
  work.mutable_header()->set_num_tensors(4);
  v1::FeedSample* s = work.add_samples();
  s->set_index(5);
  s->mutable_input_ids()->Assign(ids.begin(), ids.end());
  s->set_length(length);
  s->set_loss_mask(mask);
  s->mutable_anchors()->Assign(anchors.begin(), anchors.end());
  return work;
}

TEST(ShardBuilderTest, MalformedWorkIsRefusedNamingTheTicketAndSample) {
  const std::string four(4, '\1');
  struct Case {
    v1::ShardWork work;
    std::string message;
  } cases[] = {
      {OneSample({1, 2, 3}, 4, four, {0}), "keeps 4 of 3 tokens"},
      {OneSample({1, 2, 3, 4}, 0, "", {}), "keeps 0 of 4 tokens"},
      {OneSample(std::vector<int64_t>(30, 1), 25, std::string(25, '\1'), {0}), "(max_seq_len 24)"},
      {OneSample({1, 2, 3, 4}, 4, "\1\1", {0}), "2 loss mask values for 4 tokens"},
      {OneSample({1, 2, 3, 4}, 4, four, {4}), "anchor 4 outside 0..3"},
      {OneSample({1, 2, 3, 4}, 4, four, {-2}), "anchor -2 outside"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<uint64_t> bytes = ShardFeatureBytes(c.work, kLayout);
    ASSERT_FALSE(bytes.ok()) << c.message;
    EXPECT_THAT(bytes.status().message(), HasSubstr("ShardWork t1: sample 5: "));
    EXPECT_THAT(bytes.status().message(), HasSubstr(c.message));
    EXPECT_FALSE(BuildShard(c.work, kLayout, Compute()).ok()) << c.message;
  }
}

TEST(ShardBuilderTest, FeaturesOfTheWrongSizeAreAnError) {
  const v1::ShardWork work = OneSample({1, 2, 3, 4}, 3, std::string(3, '\1'), {0});
  ASSERT_TRUE(BuildShard(work, kLayout, Compute()).ok());
  auto short_rows = [](const std::vector<int64_t>& ids) -> absl::StatusOr<std::vector<uint8_t>> {
    return std::vector<uint8_t>(ids.size() * kFeatures);
  };
  absl::StatusOr<std::vector<grpc::ByteBuffer>> built = BuildShard(work, kLayout, short_rows);
  ASSERT_FALSE(built.ok());
  EXPECT_THAT(built.status().message(), HasSubstr("sample 5: the target gave 24 feature bytes"));
  auto failing = [](const std::vector<int64_t>&) -> absl::StatusOr<std::vector<uint8_t>> {
    return absl::ResourceExhaustedError("out of device memory");
  };
  EXPECT_EQ(BuildShard(work, kLayout, failing).status().message(), "out of device memory");
}

}  // namespace
}  // namespace flashdraft
