#include "common/job_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

constexpr const char* kMinimal = R"(
data:
  shards_dir: /data/shards
)";

TEST(JobConfigTest, ExampleJobFileLoads) {
  auto config = LoadJobConfig(FLASHDRAFT_SOURCE_DIR "/deploy/examples/job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->name, "qwen3-8b-dflash");
  EXPECT_EQ(config->target.layer_ids, (std::vector<int>{1, 9, 17, 25, 33}));
  EXPECT_EQ(config->drafter.block_size, 16);
  EXPECT_EQ(config->cluster.backend, "nccl");
  EXPECT_EQ(config->worker.device, "cuda");
  EXPECT_EQ(config->train.precision, "bf16");
  EXPECT_DOUBLE_EQ(config->train.learning_rate, 6e-4);
}

TEST(JobConfigTest, DefaultsFollowDFlash) {
  auto config = ParseJobConfig(kMinimal, "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->drafter.num_hidden_layers, 5);
  EXPECT_EQ(config->drafter.max_anchors, 512);
  EXPECT_EQ(config->data.max_seq_len, 3072);
  EXPECT_DOUBLE_EQ(config->train.grad_clip_norm, 1.0);
  EXPECT_DOUBLE_EQ(config->train.warmup_ratio, 0.04);
  EXPECT_EQ(DefaultLossDecayGamma(16), 7.0);
  EXPECT_EQ(DefaultLossDecayGamma(10), 5.0);
  EXPECT_EQ(DefaultLossDecayGamma(8), 4.0);
  EXPECT_EQ(DefaultLossDecayGamma(12), std::nullopt);
}

// The deterministic reduction is the default, with 8 virtual shards or one per possible worker.
TEST(JobConfigTest, VirtualShardsDefaultAndLimits) {
  auto config = ParseJobConfig(kMinimal, "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->train.deterministic_reduction);
  EXPECT_EQ(EffectiveVirtualShards(*config), 8);
  config->cluster.max_workers = 12;
  EXPECT_EQ(EffectiveVirtualShards(*config), 12);
  config->train.virtual_shards = 16;
  EXPECT_EQ(EffectiveVirtualShards(*config), 16);
  config->train.deterministic_reduction = false;
  EXPECT_EQ(EffectiveVirtualShards(*config), 0);
  EXPECT_THAT(std::string(ValidateJobConfig(*config, "job.yaml").message()),
              HasSubstr("job.yaml: field 'train.virtual_shards' = 16 needs "
                        "train.deterministic_reduction: true"));
  config->train.deterministic_reduction = true;
  config->train.virtual_shards = 4;
  EXPECT_THAT(std::string(ValidateJobConfig(*config, "job.yaml").message()),
              HasSubstr("field 'train.virtual_shards' = 4 is below cluster.max_workers = 12"));
}

// A checkpoint's job: the same run wherever and however long it runs, another with another seed
// or learning rate.
TEST(JobConfigTest, FingerprintNamesTheRunNotThePlace) {
  auto a = ParseJobConfig(kMinimal, "job.yaml");
  ASSERT_TRUE(a.ok());
  JobConfig b = *a;
  b.output_dir = "/elsewhere";
  b.train.max_steps = 99;
  b.cluster.max_workers = 8;
  b.train.intra_op_threads = 4;
  b.train.blas_kernel = "Haswell";  // a resume under another kernel is allowed, and says so
  b.cluster.mixed_numerics = "admit";
  EXPECT_EQ(JobFingerprint(*a), JobFingerprint(b));
  EXPECT_EQ(JobFingerprint(*a).size(), 8u);
  b.train.seed = 7;
  EXPECT_NE(JobFingerprint(*a), JobFingerprint(b));
  b = *a;
  b.train.learning_rate = 1e-3;
  EXPECT_NE(JobFingerprint(*a), JobFingerprint(b));
}

// Checkpoints record their job's fingerprint and a resume refuses another: a field added to the job
// must not change the fingerprint of a job that leaves it at its default, or every checkpoint
// written before stops resuming. This value is the fingerprint from before train.blas_kernel,
// cluster.mixed_numerics and cluster.min_feeders existed.
TEST(JobConfigTest, FingerprintOfAFixedJobNeverChanges) {
  auto a = ParseJobConfig(kMinimal, "job.yaml");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(JobFingerprint(*a), "e4894bef");
  // A schedule other than the default is another run.
  auto wsd = ParseJobConfig(kMinimal + std::string("train: {lr_schedule: wsd}\n"), "job.yaml");
  ASSERT_TRUE(wsd.ok()) << wsd.status();
  EXPECT_NE(JobFingerprint(*wsd), "e4894bef");
  auto floor = ParseJobConfig(kMinimal + std::string("train: {min_lr_ratio: 0.1}\n"), "job.yaml");
  ASSERT_TRUE(floor.ok()) << floor.status();
  EXPECT_NE(JobFingerprint(*floor), JobFingerprint(*wsd));
  // So are chats rendered otherwise (the defaults keep the value above).
  auto explicit_defaults = ParseJobConfig(
      std::string(kMinimal) + "  enable_thinking: true\n  system_prompt: ''\n", "job.yaml");
  ASSERT_TRUE(explicit_defaults.ok()) << explicit_defaults.status();
  EXPECT_EQ(JobFingerprint(*explicit_defaults), "e4894bef");
  auto no_thinking =
      ParseJobConfig(std::string(kMinimal) + "  enable_thinking: false\n", "job.yaml");
  ASSERT_TRUE(no_thinking.ok()) << no_thinking.status();
  EXPECT_NE(JobFingerprint(*no_thinking), "e4894bef");
  auto system = ParseJobConfig(std::string(kMinimal) + "  system_prompt: Be brief.\n", "job.yaml");
  ASSERT_TRUE(system.ok()) << system.status();
  EXPECT_NE(JobFingerprint(*system), "e4894bef");
  EXPECT_NE(JobFingerprint(*system), JobFingerprint(*no_thinking));
}

TEST(MultiLineTextTest, LineBreaksTabsAndUtf8AreTextOtherBytesAreNot) {
  EXPECT_EQ(MultiLineTextProblem("Be brief.\n\tNo lists. 春眠 🌸"), std::nullopt);
  EXPECT_EQ(MultiLineTextProblem("a\rb"), "has a control character (byte 1 is 0x0d)");
  EXPECT_EQ(MultiLineTextProblem("a\x7f"), "has a control character (byte 1 is 0x7f)");
  EXPECT_EQ(MultiLineTextProblem("ok \xff"), "is not UTF-8 (byte 3 is 0xff)");
  EXPECT_EQ(MultiLineTextProblem("\xc3"), "is not UTF-8 (byte 0 is 0xc3)");          // cut short
  EXPECT_EQ(MultiLineTextProblem("\xc0\xaf"), "is not UTF-8 (byte 0 is 0xc0)");      // overlong
  EXPECT_EQ(MultiLineTextProblem("\xed\xa0\x80"), "is not UTF-8 (byte 0 is 0xed)");  // surrogate
  EXPECT_EQ(MultiLineTextProblem("\xf4\x90\x80\x80"), "is not UTF-8 (byte 0 is 0xf4)");
}

TEST(JobConfigTest, AMultiLineSystemPromptReadsBackAsWritten) {
  auto config = ParseJobConfig(
      std::string(kMinimal) + "  system_prompt: |\n    Be brief.\n    \tNo \"lists\".\n",
      "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->data.system_prompt, "Be brief.\n\tNo \"lists\".\n");
  auto again = ParseJobConfig(JobConfigToYaml(*config), "round-trip");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << JobConfigToYaml(*config);
  EXPECT_EQ(again->data.system_prompt, config->data.system_prompt);
  EXPECT_EQ(JobFingerprint(*again), JobFingerprint(*config));
}

TEST(JobConfigTest, ADataMixReadsBackAndIsPartOfTheRun) {
  constexpr const char* kMix = R"(
target: {path: /m}
data:
  source: target
  sources:
    - {jsonl: /data/chat.jsonl, weight: 2}
    - jsonl: /data/code.jsonl
)";
  auto config = ParseJobConfig(kMix, "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->data.sources.size(), 2u);
  EXPECT_EQ(config->data.sources[0].jsonl, "/data/chat.jsonl");
  EXPECT_EQ(config->data.sources[0].weight, 2.0);
  EXPECT_EQ(config->data.sources[1].weight, 1.0);
  auto again = ParseJobConfig(JobConfigToYaml(*config), "round-trip");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << JobConfigToYaml(*config);
  ASSERT_EQ(again->data.sources.size(), 2u);
  EXPECT_EQ(again->data.sources[1].jsonl, "/data/code.jsonl");
  EXPECT_EQ(JobFingerprint(*again), JobFingerprint(*config));
  JobConfig lighter = *config;
  lighter.data.sources[0].weight = 1.5;
  EXPECT_NE(JobFingerprint(lighter), JobFingerprint(*config));
  // Through --set too.
  JobConfig single = *config;
  single.data.sources.clear();
  single.data.jsonl = "/data/chat.jsonl";
  EXPECT_NE(JobFingerprint(single), JobFingerprint(*config));
  ASSERT_TRUE(
      ApplyOverrides(single, {"data.jsonl=''", "data.sources=[{jsonl: /a.jsonl, weight: 0.5}]"})
          .ok());
  ASSERT_EQ(single.data.sources.size(), 1u);
  EXPECT_EQ(single.data.sources[0].weight, 0.5);
}

TEST(JobConfigTest, ABadDataMixIsNamed) {
  const std::string target = "target: {path: /m}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {target + "data: {source: target, jsonl: /a, sources: [{jsonl: /b}]}\n",
       "field 'data.sources' and data.jsonl (/a) are both set"},
      {target + "data: {source: target, sources: [{weight: 2}]}\n",
       "field 'data.sources[0].jsonl' must be set"},
      {target + "data: {source: target, sources: [{jsonl: /b, weight: 0}]}\n",
       "field 'data.sources[0].weight' = 0 must be in [1e-06, 1e+06]"},
      {target + "data: {source: target, sources: [{jsonl: /b, wieght: 2}]}\n",
       "unknown field 'data.sources[0].wieght' (known: jsonl, weight)"},
      {target + "data: {source: target, sources: {jsonl: /b}}\n",
       "field 'data.sources' must be a list"},
      {"data: {shards_dir: /s, sources: [{jsonl: /b}]}\n",
       "field 'data.sources' is a mix of chat files for data.source 'target', not 'shards'"},
      {target + "data: {source: target}\n",
       "field 'data.jsonl' or data.sources must be set when data.source is 'target'"},
  };
  for (const auto& [yaml, error] : cases) {
    auto config = ParseJobConfig(yaml, "job.yaml");
    ASSERT_FALSE(config.ok()) << yaml;
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(error)) << yaml;
  }
}

// Sliding-window layers read back from the YAML the job writes, and are part of the run (a job
// without them keeps the fingerprint it had before the fields existed).
TEST(JobConfigTest, SlidingWindowLayersReadBackAndArePartOfTheRun) {
  const std::string yaml =
      "output_dir: /o\ndata: {shards_dir: /d}\ndrafter: {num_hidden_layers: 3, layer_types: "
      "[sliding_attention, full_attention, sliding_attention], sliding_window: 2048}\n";
  auto c = ParseJobConfig(yaml, "job.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->drafter.layer_types,
            (std::vector<std::string>{"sliding_attention", "full_attention", "sliding_attention"}));
  EXPECT_EQ(c->drafter.sliding_window, 2048);
  auto again = ParseJobConfig(JobConfigToYaml(*c), "again.yaml");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->drafter.layer_types, c->drafter.layer_types);
  EXPECT_EQ(again->drafter.sliding_window, 2048);
  auto plain = ParseJobConfig(
      "output_dir: /o\ndata: {shards_dir: /d}\ndrafter: "
      "{num_hidden_layers: 3}\n",
      "plain.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_NE(JobFingerprint(*c), JobFingerprint(*plain));
  // A list of full layers only is the plain drafter, and the same run.
  auto listed = ParseJobConfig(
      "output_dir: /o\ndata: {shards_dir: /d}\ndrafter: "
      "{num_hidden_layers: 3, layer_types: [full_attention, "
      "full_attention, full_attention]}\n",
      "listed.yaml");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(JobFingerprint(*listed), JobFingerprint(*plain));
  JobConfig wider = *c;
  wider.drafter.sliding_window = 4096;
  EXPECT_NE(JobFingerprint(wider), JobFingerprint(*c));
}

// train.loss and its mix weight read back, give the objective's CE weight, and are part of the run
// (train.loss: ce, the default, keeps the fingerprint it had before the fields existed).
TEST(JobConfigTest, TheLossReadsBackAndIsPartOfTheRun) {
  const std::string base = "output_dir: /o\ndata: {shards_dir: /d}\n";
  auto mix = ParseJobConfig(base + "train: {loss: mix, ce_weight: 0.25}\n", "job.yaml");
  ASSERT_TRUE(mix.ok()) << mix.status();
  EXPECT_EQ(mix->train.loss, "mix");
  EXPECT_EQ(LossCeWeight(mix->train), 0.25);
  EXPECT_TRUE(LossNeedsTeacher(mix->train));
  auto again = ParseJobConfig(JobConfigToYaml(*mix), "again.yaml");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->train.loss, "mix");
  EXPECT_EQ(again->train.ce_weight, 0.25);
  auto kl = ParseJobConfig(base + "train: {loss: kl}\n", "job.yaml");
  auto ce = ParseJobConfig(base + "train: {loss: ce}\n", "job.yaml");
  auto plain = ParseJobConfig(base, "job.yaml");
  ASSERT_TRUE(kl.ok() && ce.ok() && plain.ok());
  EXPECT_EQ(LossCeWeight(kl->train), 0.0);
  EXPECT_EQ(LossCeWeight(ce->train), 1.0);
  EXPECT_FALSE(LossNeedsTeacher(plain->train));
  EXPECT_EQ(JobFingerprint(*ce), JobFingerprint(*plain));
  EXPECT_NE(JobFingerprint(*kl), JobFingerprint(*plain));
  EXPECT_NE(JobFingerprint(*mix), JobFingerprint(*kl));
  JobConfig heavier = *mix;
  heavier.train.ce_weight = 0.75;
  EXPECT_NE(JobFingerprint(heavier), JobFingerprint(*mix));
}

TEST(JobConfigTest, YamlRoundTrip) {
  auto config = LoadJobConfig(FLASHDRAFT_SOURCE_DIR "/deploy/examples/job.yaml");
  ASSERT_TRUE(config.ok());
  const std::string yaml = JobConfigToYaml(*config);
  auto again = ParseJobConfig(yaml, "round-trip");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << yaml;
  EXPECT_EQ(JobConfigToYaml(*again), yaml);
  EXPECT_THAT(yaml, HasSubstr("learning_rate: 0.0006\n"));
  EXPECT_EQ(again->train.adam_eps, config->train.adam_eps);
  EXPECT_EQ(again->target.layer_ids, config->target.layer_ids);
}

TEST(JobConfigTest, BadInputNamesFileFieldAndValue) {
  struct Case {
    const char* label;
    std::string yaml;
    const char* error;
  };
  const std::string base = "data: {shards_dir: /d}\n";
  const Case cases[] = {
      {"not yaml", "train: [1, 2", "job.yaml: not valid YAML"},
      {"not a mapping", "- 1\n- 2\n", "job.yaml: the job file must be a mapping"},
      {"unknown section", base + "trian: {seed: 1}\n", "job.yaml: unknown field 'trian'"},
      {"unknown field", base + "train: {lrr: 0.1}\n",
       "job.yaml: unknown field 'train.lrr' (known: seed, learning_rate"},
      {"section not a map", base + "train: 3\n", "section 'train' must be a mapping"},
      {"wrong type", base + "train: {learning_rate: fast}\n",
       "job.yaml: field 'train.learning_rate' must be a number, got 'fast'"},
      {"int expected", base + "drafter: {block_size: 2.5}\n",
       "field 'drafter.block_size' must be an integer, got '2.5'"},
      {"negative seed", base + "train: {seed: -1}\n",
       "field 'train.seed' must be a non-negative integer, got '-1'"},
      {"out of range", base + "train: {learning_rate: -0.1}\n",
       "field 'train.learning_rate' = -0.1 must be > 0"},
      {"bad enum", base + "cluster: {backend: mpi}\n",
       "field 'cluster.backend' = mpi must be one of: gloo, nccl"},
      {"bad precision", base + "train: {precision: fp16}\n",
       "field 'train.precision' = fp16 must be one of: fp32, bf16"},
      {"bad blas kernel", base + "train: {blas_kernel: 'Haswell; rm'}\n",
       "field 'train.blas_kernel' = Haswell; rm must be an OpenBLAS kernel name such as Haswell"},
      {"bad mixed numerics", base + "cluster: {mixed_numerics: warn}\n",
       "field 'cluster.mixed_numerics' = warn must be one of: refuse, admit"},
      {"bad schedule", base + "train: {lr_schedule: step}\n",
       "field 'train.lr_schedule' = step must be one of: cosine, linear, constant, wsd"},
      {"wsd longer than the run",
       base + "train: {lr_schedule: wsd, warmup_ratio: 0.5, "
              "decay_ratio: 0.6}\n",
       "field 'train.decay_ratio' = 0.6 and train.warmup_ratio = 0.5 add up to more than"},
      {"bad loss", base + "train: {loss: mse}\n",
       "field 'train.loss' = mse must be one of: ce, kl, mix"},
      {"mix weight at an end", base + "train: {loss: mix, ce_weight: 1}\n",
       "field 'train.ce_weight' = 1 must be strictly between 0 and 1 for train.loss: mix (0 is "
       "kl, 1 is ce)"},
      {"mix weight without a mix", base + "train: {loss: kl, ce_weight: 0.3}\n",
       "field 'train.ce_weight' = 0.3 weighs train.loss: mix, and the loss is kl"},
      {"floor above one", base + "train: {min_lr_ratio: 1.5}\n",
       "field 'train.min_lr_ratio' = 1.5 must be in [0, 1]"},
      {"best without eval", base + "checkpoint: {keep_best: true}\n",
       "field 'checkpoint.keep_best' needs eval.every_steps > 0"},
      {"bad device", base + "worker: {device: tpu}\n",
       "field 'worker.device' = tpu must be one of: cpu, cuda"},
      {"cuda over gloo", base + "worker: {device: cuda}\n",
       "field 'worker.device' = cuda needs cluster.backend: nccl (it is gloo"},
      {"bad layer type",
       base + "drafter: {num_hidden_layers: 2, layer_types: [full_attention, "
              "sliding], sliding_window: 64}\n",
       "field 'drafter.layer_types' = [full_attention, sliding] has entry 1 'sliding', which must "
       "be one of: full_attention, sliding_attention"},
      {"layer types for another depth",
       base + "drafter: {num_hidden_layers: 3, layer_types: [sliding_attention], "
              "sliding_window: 64}\n",
       "field 'drafter.layer_types' names 1 layers but the drafter has drafter.num_hidden_layers "
       "= 3"},
      {"window below a block",
       base + "drafter: {num_hidden_layers: 1, layer_types: [sliding_attention], "
              "sliding_window: 8}\n",
       "field 'drafter.sliding_window' = 8 must be at least drafter.block_size = 16"},
      {"window without a sliding layer", base + "drafter: {sliding_window: 64}\n",
       "field 'drafter.sliding_window' = 64 but no entry of drafter.layer_types is sliding"},
      {"list of strings expected", base + "drafter: {layer_types: full_attention}\n",
       "field 'drafter.layer_types' must be a list of strings, got 'full_attention'"},
      {"list expected", base + "target: {layer_ids: 3}\n",
       "field 'target.layer_ids' must be a list of integers, got '3'"},
      {"bool expected", base + "metrics: {enabled: maybe}\n",
       "field 'metrics.enabled' must be true or false, got 'maybe'"},
      {"eval needs prompts", base + "eval: {every_steps: 100}\n",
       "field 'eval.prompts' must be set when eval.every_steps > 0"},
      {"eval needs the target", base + "eval: {every_steps: 100, prompts: /p.jsonl}\n",
       "field 'target.path' must be set when eval.every_steps > 0 (evaluation runs the target)"},
      {"metrics port", base + "metrics: {listen: '127.0.0.1:http'}\n",
       "field 'metrics.listen' '127.0.0.1:http' is not HOST:PORT (port 0-65535; 0 picks one)"},
      {"worker metrics port", base + "metrics: {worker_listen: '0.0.0.0:70000'}\n",
       "field 'metrics.worker_listen' '0.0.0.0:70000' is not HOST:PORT"},
      {"workers inverted", base + "cluster: {min_workers: 4, max_workers: 2}\n",
       "field 'cluster.max_workers' = 2 is below cluster.min_workers = 4"},
      {"gamma needed", base + "drafter: {block_size: 12}\n",
       "field 'drafter.loss_decay_gamma' is required for block_size 12"},
      {"layer ids count", base + "target: {layer_ids: [1, 2]}\n",
       "field 'target.layer_ids' has 2 entries but drafter.num_target_features = 5"},
      {"layer ids order", base + "target: {layer_ids: [1, 9, 9, 25, 33]}\n",
       "strictly increasing; entry 2 is 9"},
      {"shards dir missing", "data: {source: shards}\n",
       "field 'data.shards_dir' must be set when data.source is 'shards'"},
      {"online needs target", "data: {source: target, jsonl: /c.jsonl}\n",
       "field 'target.path' must be set when data.source is 'target'"},
      {"tls half", base + "security: {tls_cert: /c.pem}\n",
       "field 'security.tls_key' must be set together"},
      {"client cert half", base + "security: {client_key: /w.key}\n",
       "field 'security.client_cert' must be set together"},
      {"public plaintext", base + "cluster: {listen: '0.0.0.0:7600'}\n",
       "field 'cluster.listen' '0.0.0.0:7600' accepts connections from other hosts, which needs "
       "TLS and a job secret"},
      {"public without token",
       base + "cluster: {listen: '10.0.0.5:7600'}\nsecurity: {tls_cert: /c, tls_key: /k}\n",
       "security.token_file"},
      {"complex key", "? [a, b]\n: 1\n", "job.yaml: a key that is not a plain name (line 1)"},
      {"complex field key", "train: {? {x: 1} : 2}\n", "a key that is not a plain name"},
      {"heartbeat",
       base + "cluster: {heartbeat_interval_seconds: 5, heartbeat_timeout_seconds: 5}\n",
       "field 'cluster.heartbeat_timeout_seconds' = 5 must exceed"},
      // Found by fuzz_job_config: printed back, a carriage return made another value.
      {"carriage return", "data: {shards_dir: \"/data\\r\\r\"}\n",
       "field 'data.shards_dir' = \"/data\\r\\r\" has a control character (byte 5 is 0x0d)"},
      {"tab in a name", base + "name: \"a\\tb\"\n",
       "field 'name' = \"a\\tb\" has a control character (byte 1 is 0x09)"},
      // A prompt may span lines, but a carriage return would not read back (above).
      {"carriage return in a prompt", "data: {shards_dir: /d, system_prompt: \"a\\r\\nb\"}\n",
       "field 'data.system_prompt' = \"a\\r\\nb\" has a control character (byte 1 is 0x0d); "
       "text may have line breaks and tabs"},
      // Nor would bytes that are not UTF-8 (YAML writes U+FFFD instead, protobuf refuses them).
      {"not UTF-8 in a prompt", "data: {shards_dir: /d, system_prompt: \"ok \xff\"}\n",
       "field 'data.system_prompt' = \"ok \\xff\" is not UTF-8 (byte 3 is 0xff)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    auto config = ParseJobConfig(c.yaml, "job.yaml");
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr(c.error));
  }
}

TEST(JobConfigTest, AWorkersCollectivesIncludeTheJobsBackend) {
  EXPECT_TRUE(OffersBackend("gloo,nccl", "nccl"));
  EXPECT_TRUE(OffersBackend("gloo,nccl", "gloo"));
  EXPECT_FALSE(OffersBackend("gloo", "nccl"));
  EXPECT_FALSE(OffersBackend("gloo,ncc", "nccl"));
  EXPECT_TRUE(OffersBackend("", "gloo"));  // a worker from before the GPU path
  EXPECT_FALSE(OffersBackend("", "nccl"));
}

TEST(JobConfigTest, OnlyLoopbackListensGoWithoutTlsAndAToken) {
  for (const char* listen : {"127.0.0.1:0", "127.0.1.1:7600", "localhost:7600", "[::1]:7600"}) {
    EXPECT_TRUE(IsLoopbackListen(listen)) << listen;
  }
  for (const char* listen : {"0.0.0.0:7600", "[::]:7600", "10.0.0.5:7600", "node1:7600",
                             "[::ffff:127.0.0.1]:1", "localhost.evil:7600"}) {
    EXPECT_FALSE(IsLoopbackListen(listen)) << listen;
  }
  const std::string base = "data: {shards_dir: /d}\ncluster: {listen: '0.0.0.0:7600'}\n";
  EXPECT_TRUE(ParseJobConfig(base + "security: {insecure: true}\n", "job.yaml").ok());
  EXPECT_TRUE(
      ParseJobConfig(base + "security: {tls_cert: /c, tls_key: /k, token_file: /t}\n", "job.yaml")
          .ok());
}

TEST(JobConfigTest, MissingFileIsNamed) {
  auto config = LoadJobConfig("/nonexistent/job.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("/nonexistent/job.yaml: cannot open"));
}

TEST(JobConfigTest, OverridesAreValidated) {
  auto config = ParseJobConfig(kMinimal, "job.yaml");
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(ApplyOverrides(*config, {"train.learning_rate=3e-4"}).ok());
  EXPECT_DOUBLE_EQ(config->train.learning_rate, 3e-4);
  ASSERT_TRUE(ApplyOverrides(*config, {"output_dir=/tmp/run"}).ok());
  EXPECT_EQ(config->output_dir, "/tmp/run");
  ASSERT_TRUE(ApplyOverrides(*config, {"target.layer_ids=[1,2,3,4,5]"}).ok());
  EXPECT_EQ(config->target.layer_ids.size(), 5u);
  EXPECT_THAT(ApplyOverrides(*config, {"train.nope=1"}).message(),
              HasSubstr("unknown field 'train.nope'"));
  EXPECT_THAT(ApplyOverrides(*config, {"train.seed"}).message(),
              HasSubstr("must look like section.field=value"));
  EXPECT_THAT(ApplyOverrides(*config, {"cluster.min_workers=0"}).message(),
              HasSubstr("field 'cluster.min_workers' = 0 must be in [1, 100000]"));
  // A refused override leaves the config as it was.
  EXPECT_EQ(config->cluster.min_workers, 1);
  // Fields that go in pairs are validated together, not one override at a time.
  EXPECT_THAT(ApplyOverrides(*config, {"security.tls_cert=/c.pem"}).message(),
              HasSubstr("security.tls_key"));
  EXPECT_TRUE(
      ApplyOverrides(*config, {"security.tls_cert=/c.pem", "security.tls_key=/c.key"}).ok());
  EXPECT_EQ(config->security.tls_key, "/c.key");
}

}  // namespace
}  // namespace flashdraft
