// The YAML job file (docs/ARCHITECTURE.md) as validated option structs. Every field has a default,
// is checked on load, and errors name the file, the field path and the offending value. Unknown
// fields are errors too: a typo must not silently fall back to a default.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/multi_line_text.h"

namespace flashdraft {

struct TargetConfig {
  // Hugging Face model folder (config.json + safetensors). Empty when training from shards only.
  std::string path;
  // Decoder layers whose outputs condition the drafter (layer id i = output of decoder layer i).
  // Empty: computed from the drafter's num_target_features and the target's layer count.
  std::vector<int> layer_ids;
  // "float32" | "bfloat16": the dtype hidden states travel in, and the target runs in on a GPU
  // (target.device: cuda; on CPUs it runs in fp32).
  std::string dtype = "bfloat16";
  // "cpu" | "cuda": where the coordinator runs the online target (data.source: target). cuda: the
  // first visible GPU; a target that does not fit it is refused, naming the memory it needs.
  std::string device = "cpu";
};

struct DrafterConfig {
  int num_hidden_layers = 5;
  int block_size = 16;
  // Number of target layers whose features are concatenated (n in n·H).
  int num_target_features = 5;
  // 0: take the target's intermediate size.
  int intermediate_size = 0;
  // -1: the first id after the tokenizer's vocabulary (DFLASH.md §2).
  int64_t mask_token_id = -1;
  // Loss decay γ; 0: the DFlash default for the block size (7 for 16, 5 for 10, 4 for 8).
  double loss_decay_gamma = 0;
  int max_anchors = 512;
  // Per layer, "full_attention" or "sliding_attention" (HF's layer_types); empty: all full. A
  // sliding layer sees the last `sliding_window` positions up to its query and is causal inside
  // its block (the SpecForge / SGLang / vLLM convention; docs/recipes.md).
  std::vector<std::string> layer_types;
  // The window of the sliding layers in positions, the query's own included (HF's
  // sliding_window); at least block_size. 0 when no layer slides.
  int sliding_window = 0;
  // A published or exported drafter folder (config.json + model.safetensors, the z-lab / HF
  // layout, BF16 or F32) to start from instead of a random init: fine-tuning. Its shapes must fit
  // the job's; its block size and mask token may differ (they shape no weight).
  std::string init_from;
};

// One file of a data mix (data.sources).
struct DataSourceConfig {
  std::string jsonl;
  // How many times each of its lines is a sample in an epoch: 2 twice, 0.5 half of its lines
  // (the same half all job long, chosen by train.seed).
  double weight = 1.0;
};

struct DataConfig {
  // "shards" (offline safetensors shards) or "target" (hidden states computed online).
  std::string source = "shards";
  std::string shards_dir;
  // Chat data (JSONL) for the online source: one file, or a weighted mix of several (not both).
  std::string jsonl;
  std::vector<DataSourceConfig> sources;
  int max_seq_len = 3072;
  // Number of samples the source keeps ready ahead of the scheduler.
  int prefetch_steps = 2;
  // Online source: replace every assistant turn by the target's own greedy answer when the data
  // is opened (the DFlash recipe: the drafter learns what the target actually says).
  bool regenerate = false;
  int max_new_tokens = 256;  // per regenerated answer
  // How chat lines are rendered, alike in training, regeneration and evaluation (eval.prompts):
  // false is Qwen3's non-thinking mode (the server's `enable_thinking: false`); a non-empty
  // system_prompt becomes the system turn of every chat that has none (common/chat_template.h).
  bool enable_thinking = true;
  MultiLineText system_prompt;
};

struct TrainConfig {
  uint64_t seed = 0;
  double learning_rate = 6e-4;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;
  double adam_eps = 1e-8;
  double weight_decay = 0.0;
  double grad_clip_norm = 1.0;
  // The learning rate of each step (docs/recipes.md compares it with Hugging Face's schedules): the
  // first warmup_ratio of the steps rise linearly from 0 to learning_rate; then "cosine" falls
  // along half a cosine toward the floor, "linear" along a straight line, "constant" stays at
  // learning_rate, and "wsd" (warmup-stable-decay) stays at learning_rate until the last
  // decay_ratio of the steps, which fall along a straight line. The floor is min_lr_ratio x
  // learning_rate, reached one step after the last.
  double warmup_ratio = 0.04;
  std::string lr_schedule = "cosine";
  double decay_ratio = 0.1;  // wsd only
  double min_lr_ratio = 0.0;
  // The training objective at every drafted position, weighted by DFlash's position decay: "ce"
  // cross-entropy on the data's next token; "kl" KL(target ‖ drafter), distillation from the
  // target's own next-token distribution (its final hidden state through the frozen lm_head, one
  // more feature layer on the wire: hidden_size values per token); "mix" ce_weight x CE + (1 -
  // ce_weight) x KL.
  std::string loss = "ce";
  double ce_weight = 0.5;  // mix only, strictly between 0 and 1
  int epochs = 6;
  // 0: derived from epochs and the data set size.
  int64_t max_steps = 0;
  // Samples per global step, split across workers by tokens.
  int global_batch_size = 32;
  // LibTorch intra-op threads of every worker. One value for the whole job: some CPU reductions
  // (the gradient norm, RMSNorm weight gradients) split their sums by thread count.
  int intra_op_threads = 1;
  // Sum gradients by a fixed tree over virtual shards (see virtual_shards): every step's numbers
  // are then the same to the bit on any number of workers. false: Gloo's all-reduce, one shard per
  // worker (summation order, and so the last bits, depend on the world size).
  bool deterministic_reduction = true;
  // K, the fixed number of pieces each global batch is cut into (each is one forward/backward on
  // some worker, the same bytes whoever runs it). 0: 8, or cluster.max_workers when that is
  // larger. Must be >= cluster.max_workers; changing it changes the numbers (another summation
  // tree, other batch shapes).
  int virtual_shards = 0;
  // "fp32" | "bf16": the drafter's matrix products in bf16 (fp32 master weights, optimizer state,
  // norms, softmax and loss; model/precision.h). Hidden states travel in target.dtype either way.
  std::string precision = "fp32";
  // The OpenBLAS kernel of every process of the job ("Haswell", "SkylakeX", "Zen", ...; OpenBLAS's
  // core names): each kernel rounds differently, and OpenBLAS picks one per CPU unless
  // OPENBLAS_CORETYPE names it when the process starts. launch, the deploy scripts and the
  // binaries themselves pass it (docs/determinism.md). Empty: each process's own choice, and the
  // coordinator still refuses a worker whose kernel differs from the other workers'.
  std::string blas_kernel;
};

struct ClusterConfig {
  std::string listen = "127.0.0.1:0";
  int min_workers = 1;
  int max_workers = 1;
  // "gloo" (CPUs) | "nccl" (GPUs; workers built with -DFLASHDRAFT_WITH_CUDA=ON, one GPU each).
  std::string backend = "gloo";
  // Network interface for collective traffic (Gloo/NCCL are unauthenticated: keep it private).
  std::string collective_interface;
  double heartbeat_interval_seconds = 2.0;
  double heartbeat_timeout_seconds = 20.0;
  double collective_timeout_seconds = 300.0;
  double join_timeout_seconds = 600.0;
  // A worker whose training thread stays in one computing phase (forward, backward, optimizer,
  // checkpoint snapshot) this long is lost, even while its heartbeats arrive.
  double stall_timeout_seconds = 300.0;
  // Gradients are summed in buckets of this size, each starting while backward still runs.
  double allreduce_bucket_mib = 4.0;
  // A worker whose numeric environment (LibTorch build, BLAS and its kernel, device) differs from
  // the other workers': "refuse" it, naming the difference, or "admit" it with a warning — the job
  // then records that its numbers are no longer reproducible to the bit (docs/determinism.md).
  std::string mixed_numerics = "refuse";
  // Target feeders (docs/ARCHITECTURE.md, "Feeders"; data.source: target): 0 runs the target in
  // the coordinator; N > 0 waits for N feeders before the first step, computes every shard on a
  // feeder and pauses while none is left.
  int min_feeders = 0;
};

struct WorkerConfig {
  // "cpu" | "cuda": where each worker trains. cuda: cuda:<local rank> (launch and the deploy
  // scripts give each worker its own GPU: --cuda-device, LOCAL_RANK or CUDA_VISIBLE_DEVICES); needs
  // cluster.backend: nccl and a LibTorch built with CUDA.
  std::string device = "cpu";
};

struct CheckpointConfig {
  std::string dir;  // empty: <output_dir>/checkpoints
  // 0: none before the last step. The last step is always checkpointed: the finished job's
  // drafter export (<output_dir>/drafter) is written from that checkpoint.
  int every_steps = 500;
  // Also checkpoint when this long has passed since the last one (0: never).
  double every_seconds = 0;
  int keep_last = 3;
  // With eval.every_steps: the evaluated checkpoint with the highest tau (accepted tokens per
  // verify cycle, as flashdraft eval reports it) is never pruned, and is exported beside the final
  // drafter as <output_dir>/drafter-best.
  bool keep_best = false;
  // Start from the newest checkpoint in `dir` when there is one (the step after it, its weights and
  // optimizer state); a fresh start otherwise.
  bool resume = false;
};

// Speculative decoding with the current weights during training (DFLASH.md §5, as `flashdraft
// eval` runs it) on held-out prompts, every `every_steps` steps (those steps are checkpointed: the
// coordinator evaluates the checkpoint on its own thread while training goes on). Needs the full
// target (target.path). Results: "eval" records in steps.jsonl and flashdraft_eval_* metrics.
struct EvalConfig {
  int every_steps = 0;  // 0: never
  std::string prompts;  // JSONL as `flashdraft eval --prompts` reads it
  int limit = 16;       // the first N prompts
  int64_t max_new_tokens = 64;
  int block_size = 0;  // 0: the drafter's
};

struct MetricsConfig {
  bool enabled = true;
  std::string listen = "127.0.0.1:0";  // the coordinator's /metrics
  // Each worker's /metrics (port 0: each picks one; it tells the coordinator, which lists it in
  // <output_dir>/prometheus/targets.json). On every interface (0.0.0.0:PORT) a worker is listed
  // under the address it reaches the coordinator from. Empty: workers serve no metrics.
  std::string worker_listen = "127.0.0.1:0";
};

// docs/SECURITY.md. Paths are read once, at start.
struct SecurityConfig {
  // The coordinator's certificate (chain) and private key, PEM: its gRPC port speaks TLS.
  std::string tls_cert;
  std::string tls_key;
  // The CA (PEM) that signed the coordinator's certificate: clients (launch's workers, `status
  // --job`) verify the coordinator with it, and with client_auth the coordinator requires client
  // certificates signed by it (mutual TLS).
  std::string tls_ca;
  bool client_auth = true;
  // The client certificate and key that `flashdraft launch` gives its workers (and `flashdraft
  // status --job` presents) under mutual TLS.
  std::string client_cert;
  std::string client_key;
  // The name the coordinator's certificate carries, when clients reach it by an address that is
  // not in the certificate (an IP, 127.0.0.1 under launch). Empty: the address's host.
  std::string server_name;
  // The job secret: every RPC must carry it (a bearer token, compared in constant time). The file
  // must not be readable by others.
  std::string token_file;
  // Allow a cluster.listen reachable from other hosts without TLS and a token (a network you trust
  // completely). Logged as a warning and shown in /metrics (flashdraft_build_info{security}).
  bool insecure = false;
};

struct JobConfig {
  std::string name = "flashdraft";
  std::string output_dir = "runs/flashdraft";
  TargetConfig target;
  DrafterConfig drafter;
  DataConfig data;
  TrainConfig train;
  ClusterConfig cluster;
  WorkerConfig worker;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  MetricsConfig metrics;
  SecurityConfig security;
};

// Parses and validates YAML text; `source` names it in errors (a path, or "<flags>").
absl::StatusOr<JobConfig> ParseJobConfig(const std::string& yaml_text, const std::string& source);
absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path);

// Applies overrides "section.field=value" (command-line flags), then validates the result like
// the file; nothing changes on an error.
absl::Status ApplyOverrides(JobConfig& config, const std::vector<std::string>& assignments);

// Checks cross-field rules (also run by the loaders).
absl::Status ValidateJobConfig(const JobConfig& config, const std::string& source);

// True when `listen` (host:port) only accepts connections from this host: 127.x, ::1 or localhost.
bool IsLoopbackListen(const std::string& listen);

// True when `offered`, the comma-separated collectives a worker was built with ("gloo",
// "gloo,nccl"; empty from workers that predate the GPU path: "gloo"), includes `backend`.
bool OffersBackend(const std::string& offered, const std::string& backend);

// The number of virtual shards per step (train.virtual_shards after its default), or 0 when the
// job sums with the plain all-reduce (one shard per worker).
int64_t EffectiveVirtualShards(const JobConfig& config);

// drafter.loss_decay_gamma after its default for the block size (a validated job has one).
double EffectiveLossDecayGamma(const JobConfig& config);

// The weight of cross-entropy in the job's objective (train.loss): 1 for ce, 0 for kl, ce_weight
// for mix; KL has the rest.
double LossCeWeight(const TrainConfig& train);
// Whether the objective needs the target's final hidden state (the teacher feature).
inline bool LossNeedsTeacher(const TrainConfig& train) { return LossCeWeight(train) < 1.0; }

// What makes two runs the same training run, as 8 hex digits: the target, drafter, data and the
// optimizer's settings and seed. Not the place (output_dir, cluster, checkpoint, metrics,
// security), the length (max_steps, epochs) or how the arithmetic is spread (threads, reduction).
// A checkpoint records it; resuming from another job's checkpoint is refused.
std::string JobFingerprint(const JobConfig& config);

// Canonical YAML of the whole config, with every field (what a coordinator sends to workers).
std::string JobConfigToYaml(const JobConfig& config);

// The DFlash loss decay for a block size, or nullopt where the paper gives none.
std::optional<double> DefaultLossDecayGamma(int block_size);

}  // namespace flashdraft
