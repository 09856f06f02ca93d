#include "coordinator/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/coordinator.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

StepRecord Record() {
  StepRecord r;
  r.step = 4;
  r.loss = 1.5;
  r.tokens = 100;
  r.world_size = 2;
  r.slot_correct = {3, 1, 0};
  r.slot_total = {4, 4, 4};
  r.step_seconds = 0.3;
  r.forward_seconds = 0.1;
  r.learning_rate = 0.001;
  return r;
}

TEST(CoordinatorMetricsTest, StepsSetGaugesCountersAndHistograms) {
  CoordinatorMetrics m("gloo", 30, 4);
  m.RecordStep(Record());
  m.RecordStep(Record());
  m.SetWorkers(2, 1, 3);
  m.StepsReissued(2);
  m.RecordRecovery(1.5);
  m.SetMissingWorkers(1);
  m.AddStreamBytes(4096);
  const std::string text = m.Text();
  EXPECT_THAT(text, HasSubstr("flashdraft_build_info{"));
  EXPECT_THAT(text, HasSubstr("backend=\"gloo\""));
  EXPECT_THAT(text, HasSubstr("flashdraft_step 5\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_steps 30\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_loss 1.5\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_slot_accuracy{position=\"1\"} 0.75\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_slot_accuracy{position=\"3\"} 0\n"));
  // τ = 1 + 0.75 + 0.75·0.25 + 0
  EXPECT_THAT(text, HasSubstr("flashdraft_tau_estimate 1.9375\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_tokens_total 200\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_step_duration_seconds_count 2\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_phase_duration_seconds_sum{phase=\"forward\"} 0.2"));
  EXPECT_THAT(text, HasSubstr("flashdraft_workers{state=\"training\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_workers{state=\"waiting\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_workers_missing 1\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_membership_epoch 3\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_steps_reissued_total 2\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_recovery_duration_seconds_count 1\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_stream_bytes_total{direction=\"sent\"} 4096\n"));
}

// The coordinator's numeric environment in the build info; a mixed job raises its gauge.
TEST(CoordinatorMetricsTest, NumericsInBuildInfoAndTheMixedGauge) {
  CoordinatorMetrics m(
      "gloo", 30, 4, "plaintext",
      {{"torch", "1.13.0 cpu, AVX2"}, {"blas", "OpenBLAS 0.3.21"}, {"blas_kernel", "Haswell"}});
  EXPECT_THAT(m.Text(), HasSubstr("flashdraft_build_info{backend=\"gloo\",blas=\"OpenBLAS "
                                  "0.3.21\",blas_kernel=\"Haswell\",commit="));
  EXPECT_THAT(m.Text(), HasSubstr("torch=\"1.13.0 cpu, AVX2\""));
  EXPECT_THAT(m.Text(), HasSubstr("flashdraft_numerics_mixed 0\n"));
  m.SetNumericsMixed(true);
  EXPECT_THAT(m.Text(), HasSubstr("flashdraft_numerics_mixed 1\n"));
}

// Evaluations add to vLLM-style counters (each evaluation's cycles, drafted and accepted tokens,
// per position) and set the last τ.
TEST(CoordinatorMetricsTest, EvaluationsCountLikeVllmsSpecDecodeCounters) {
  CoordinatorMetrics m("gloo", 30, 4);
  EvalSummary e;
  e.prompts = 2;
  e.drafts = 10;
  e.draft_tokens = 30;
  e.accepted_tokens = 12;
  e.accepted_per_position = {7, 4, 1};
  e.tau = 2.2;
  e.seconds = 0.5;
  m.RecordEval(e);
  e.tau = 2.5;
  m.RecordEval(e);
  const std::string text = m.Text();
  EXPECT_THAT(text, HasSubstr("flashdraft_eval_num_drafts_total 20\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_eval_num_draft_tokens_total 60\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_eval_num_accepted_tokens_total 24\n"));
  EXPECT_THAT(text,
              HasSubstr("flashdraft_eval_num_accepted_tokens_per_pos_total{position=\"1\"} 14\n"));
  EXPECT_THAT(text,
              HasSubstr("flashdraft_eval_num_accepted_tokens_per_pos_total{position=\"3\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_eval_tau 2.5\n"));
}

// A real scrape over HTTP of what Serve() exposes.
TEST(CoordinatorMetricsTest, ServesTheTextOverHttp) {
  CoordinatorMetrics m("gloo", 30, 4);
  m.RecordStep(Record());
  absl::StatusOr<int> port = m.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  auto response = testing::HttpGet(*port, "/metrics");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_THAT(response->body, HasSubstr("flashdraft_loss 1.5\n"));
  EXPECT_THAT(response->body, HasSubstr("# TYPE flashdraft_tokens_total counter"));
  CoordinatorMetrics other("gloo", 30, 4);
  EXPECT_THAT(std::string(other.Serve("not-an-address").status().message()),
              HasSubstr("metrics.listen not-an-address: cannot serve /metrics"));
}

}  // namespace
}  // namespace flashdraft
