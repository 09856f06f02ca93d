#include "model/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "model/loss_chunks.h"

namespace flashdraft {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
// LibTorch, gRPC, OpenBLAS and the binary, resident before any tensor (measured: 160–190 MiB).
constexpr int64_t kRuntimeBytes = 170 * kMiB;
// The tile budgets of the target's attention and feed-forward (model/target_model.h) and of the
// drafter's block attention and loss (model/dflash_attention.h, weighted_cross_entropy.h).
constexpr int64_t kTargetTileBytes = 32 * kMiB;
constexpr int64_t kDrafterChunkBytes = 64 * kMiB;

int64_t DrafterParameters(const DrafterModelConfig& d) {
  const int64_t h = d.hidden_size, q = d.num_attention_heads * d.head_dim,
                kv = d.num_key_value_heads * d.head_dim;
  const int64_t layer =
      2 * h + 2 * h * q + 2 * h * kv + 3 * h * d.intermediate_size + 2 * d.head_dim;
  return d.feature_size() * h + h + h + d.num_hidden_layers * layer;  // fc, its norm, final norm
}

// The frozen embeddings and lm_head every worker holds and the coordinator serves, fp32.
int64_t FrozenBytes(const DrafterModelConfig& d) {
  return d.vocab_size * d.hidden_size * 4 * (d.tie_word_embeddings ? 1 : 2);
}

// The working set of one target forward over `s` positions: the residual stream and its norms,
// projections, the requested layers' outputs, one attention tile and one feed-forward chunk.
int64_t TargetForwardBytes(const TargetModelConfig& t, int64_t s, int64_t dsize, int n_layers) {
  const int64_t q = t.num_attention_heads * t.head_dim, kv = t.num_key_value_heads * t.head_dim;
  const int64_t stream = s * t.hidden_size * dsize * (8 + 2 * n_layers);
  const int64_t projections = s * (q + 2 * kv) * dsize * 2;
  const int64_t query_tile = std::min<int64_t>(s, 256);
  const int64_t tile = std::min(kTargetTileBytes, t.num_attention_heads * query_tile * s * 4);
  const int64_t mlp = std::min(kTargetTileBytes, s * t.intermediate_size * dsize * 3);
  return stream + projections + 4 * tile + 2 * mlp;
}

void Add(ProcessMemory& p, std::string what, int64_t bytes, bool on_gpu = false) {
  if (bytes > 0) p.parts.push_back({std::move(what), bytes, on_gpu});
}

// Elements per token on the wire: the drafter's n·H features and, with train.loss kl / mix, the
// target's final hidden state (H more).
int64_t WireFeatureSize(const JobConfig& job, const DrafterModelConfig& d) {
  return d.feature_size() + (LossNeedsTeacher(job.train) ? d.hidden_size : 0);
}

// The target's weights and forward in a process that holds it: one that computes the features
// (the coordinator without feeders, a feeder), and one that `generates` (whoever regenerates the
// replies, the coordinator alone or the feeders; the coordinator for evaluation).
void AddTargetParts(const JobConfig& job, const MemoryInputs& in, bool computes_features,
                    bool generates, ProcessMemory& c) {
  const TargetModelConfig& t = in.target;
  const bool gpu = job.target.device == "cuda";
  // On a CPU the target runs in fp32 whatever target.dtype (which sets the features' wire type).
  const int64_t dsize = gpu && job.target.dtype == "bfloat16" ? 2 : 4;
  const int64_t params = TargetParameterCount(t);
  Add(c, absl::StrCat("target weights (", dsize == 2 ? "bf16" : "fp32", ")"), params * dsize, gpu);
  Add(c, "target load buffer (its largest tensor as stored)",
      t.vocab_size * t.hidden_size * in.target_stored_bytes_per_weight);
  const int n = static_cast<int>(WireFeatureSize(job, in.drafter) / in.drafter.hidden_size);
  generates = generates && (job.data.regenerate || job.eval.every_steps > 0);
  if (computes_features || generates) {
    Add(c, "target forward at data.max_seq_len",
        TargetForwardBytes(t, job.data.max_seq_len, dsize, n), gpu);
  }
  if (generates) {
    const int64_t kv = t.num_key_value_heads * t.head_dim;
    Add(c, "KV cache and logits (regeneration, evaluation)",
        t.num_hidden_layers * 2 * (job.data.max_seq_len + job.data.max_new_tokens) * kv * dsize +
            2 * job.drafter.block_size * t.vocab_size * 4,
        gpu);
  }
}

// The features of the prefetch window (data.prefetch_steps), packed for the wire.
int64_t PrefetchBytes(const JobConfig& job, const DrafterModelConfig& d) {
  const int64_t wire = job.target.dtype == "bfloat16" ? 2 : 4;
  return int64_t{job.data.prefetch_steps} * job.train.global_batch_size * job.data.max_seq_len *
         WireFeatureSize(job, d) * wire * 2;
}

ProcessMemory CoordinatorMemory(const JobConfig& job, const MemoryInputs& in, int feeders) {
  const DrafterModelConfig& d = in.drafter;
  ProcessMemory c{"coordinator", {}};
  Add(c, "runtime (LibTorch, gRPC)", kRuntimeBytes);
  if (in.online_target && feeders == 0) {
    AddTargetParts(job, in, /*computes_features=*/true, /*generates=*/true, c);
  } else if (in.online_target) {
    // The feeders run the target (features, regeneration): the coordinator loads its embedding
    // and lm_head only, and a whole replica to evaluate.
    const int64_t dsize = job.target.device == "cuda" && job.target.dtype == "bfloat16" ? 2 : 4;
    Add(c, "target embedding and lm_head (no decoder layer: the feeders run them)",
        FrozenBytes(d) / 4 * dsize);
    if (job.eval.every_steps > 0) {
      AddTargetParts(job, in, /*computes_features=*/false, /*generates=*/true, c);
    }
  }
  Add(c, "frozen embeddings served to workers (fp32, mapped)", FrozenBytes(d));
  // With feeders the features go from them to the workers, never through the coordinator.
  if (feeders == 0) Add(c, "prefetched features (data.prefetch_steps)", PrefetchBytes(job, d));
  const int64_t p = DrafterParameters(d);
  Add(c, "received checkpoint and export (weights, AdamW)", p * 4 * 3 + p * 2);
  if (job.eval.every_steps > 0) Add(c, "evaluated drafter (fp32)", p * 4);
  return c;
}

ProcessMemory WorkerMemory(const JobConfig& job, const MemoryInputs& in, int workers) {
  const DrafterModelConfig& d = in.drafter;
  const bool gpu = job.worker.device == "cuda";
  const int64_t micro = (job.train.global_batch_size + workers - 1) / std::max(1, workers);
  const int64_t s = job.data.max_seq_len, h = d.hidden_size;
  const int64_t rows = micro * job.drafter.max_anchors * d.block_size;
  const int64_t kv = d.num_key_value_heads * d.head_dim;
  const int64_t p = DrafterParameters(d);
  ProcessMemory w{"worker", {}};
  Add(w, "runtime (LibTorch, gRPC)", kRuntimeBytes);
  Add(w, "frozen embeddings and lm_head (fp32)", FrozenBytes(d), gpu);
  Add(w, "drafter weights, gradients, AdamW moments (fp32)", p * 16, gpu);
  Add(w, "checkpoint upload (rank 0)", p * 12 * 2);
  const int64_t layers = d.num_hidden_layers *
                         (10 * rows * h + 3 * rows * d.intermediate_size + 4 * (s + rows) * kv) * 4;
  Add(w, "activations at max_anchors x block_size", layers + micro * s * (d.feature_size() + h) * 4,
      gpu);
  const int64_t attention =
      std::min(kDrafterChunkBytes, micro * d.num_attention_heads * rows * (s + d.block_size) * 4);
  const int64_t chunk_rows = LossNeedsTeacher(job.train) ? DistillationChunkRows(d.vocab_size)
                                                         : LossChunkRows(d.vocab_size);
  const int64_t loss = std::min(rows, chunk_rows) * d.vocab_size * 4;
  // With distillation, the teacher's rows of the step too (rows x H).
  const int64_t loss_rows = (LossNeedsTeacher(job.train) ? 3 : 2) * rows * h * 4;
  Add(w, "attention and loss chunks", 4 * attention + 3 * loss + loss_rows, gpu);
  Add(w, "received features", 2 * micro * s * WireFeatureSize(job, d) * 4);
  Add(w, "gradient all-reduce buckets",
      static_cast<int64_t>(job.cluster.allreduce_bucket_mib * 2 * kMiB), gpu);
  return w;
}

// A feeder: the target's replica and forward, and the features it computed for the prefetch
// window (all of them when it is the only one live), at most its --max-bytes.
ProcessMemory FeederMemory(const JobConfig& job, const MemoryInputs& in, int64_t max_bytes) {
  ProcessMemory f{"feeder", {}};
  Add(f, "runtime (LibTorch, gRPC)", kRuntimeBytes);
  AddTargetParts(job, in, /*computes_features=*/true, /*generates=*/job.data.regenerate, f);
  Add(f, "computed features held (the prefetch window, at most --max-bytes)",
      std::min(max_bytes, PrefetchBytes(job, in.drafter)));
  return f;
}

std::string Mib(int64_t bytes) { return absl::StrFormat("%.0f MiB", bytes / double(kMiB)); }

int64_t Sum(const ProcessMemory& p, bool gpu) {
  int64_t total = 0;
  for (const MemoryPart& part : p.parts) total += part.on_gpu == gpu ? part.bytes : 0;
  return total;
}

}  // namespace

int64_t ProcessMemory::HostBytes() const { return Sum(*this, false); }
int64_t ProcessMemory::GpuBytes() const { return Sum(*this, true); }

const MemoryPart* ProcessMemory::Largest(bool gpu) const {
  const MemoryPart* best = nullptr;
  for (const MemoryPart& part : parts) {
    if (part.on_gpu == gpu && (best == nullptr || part.bytes > best->bytes)) best = &part;
  }
  return best;
}

int64_t JobMemory::TotalHostBytes() const {
  return coordinator.HostBytes() + workers * worker.HostBytes() + feeders * feeder.HostBytes();
}

JobMemory EstimateJobMemory(const JobConfig& job, const MemoryInputs& inputs, int workers,
                            int feeders, int64_t feeder_max_bytes) {
  JobMemory m;
  m.workers = std::max(1, workers);
  m.feeders = inputs.online_target ? std::max(0, feeders) : 0;
  m.coordinator = CoordinatorMemory(job, inputs, m.feeders);
  m.worker = WorkerMemory(job, inputs, m.workers);
  if (m.feeders > 0) m.feeder = FeederMemory(job, inputs, feeder_max_bytes);
  return m;
}

absl::StatusOr<MemoryInputs> MemoryInputsForJob(const JobConfig& job) {
  MemoryInputs in;
  if (job.data.source == "target") {
    const std::string path = job.target.path + "/config.json";
    FD_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    FD_ASSIGN_OR_RETURN(in.target, ParseTargetConfig(text, path));
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    in.target_stored_bytes_per_weight = j.value("torch_dtype", "bfloat16") == "float32" ? 4 : 2;
    in.online_target = true;
    const std::vector<int> layers =
        job.target.layer_ids.empty()
            ? DefaultTargetLayerIds(static_cast<int>(in.target.num_hidden_layers),
                                    job.drafter.num_target_features)
            : job.target.layer_ids;
    in.drafter =
        DrafterConfigForTarget(in.target, layers, job.data.max_seq_len, job.drafter.mask_token_id);
  } else {
    const std::string path = job.data.shards_dir + "/manifest.json";
    FD_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    const nlohmann::json* config = nullptr;
    if (j.is_object() && j.contains("metadata") && j["metadata"].contains("drafter_config") &&
        j["metadata"]["drafter_config"].is_string()) {
      config = &j["metadata"]["drafter_config"];
    }
    if (config == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": no metadata.drafter_config (the target's shape)"));
    }
    FD_ASSIGN_OR_RETURN(in.drafter, ParseDrafterConfig(config->get<std::string>(), path));
  }
  in.drafter.num_hidden_layers = job.drafter.num_hidden_layers;
  in.drafter.block_size = job.drafter.block_size;
  if (job.drafter.intermediate_size > 0)
    in.drafter.intermediate_size = job.drafter.intermediate_size;
  return in;
}

std::string FormatJobMemory(const JobMemory& m) {
  std::string out;
  for (const ProcessMemory* p : {&m.coordinator, &m.worker, &m.feeder}) {
    if (p == &m.feeder && m.feeders == 0) continue;
    std::vector<MemoryPart> parts = p->parts;
    std::stable_sort(parts.begin(), parts.end(),
                     [](const MemoryPart& a, const MemoryPart& b) { return a.bytes > b.bytes; });
    absl::StrAppend(&out, "# ",
                    p == &m.worker   ? absl::StrCat("each of ", m.workers, " worker(s)")
                    : p == &m.feeder ? absl::StrCat("each of ", m.feeders, " feeder(s)")
                                     : std::string("coordinator"),
                    ": expected peak ", Mib(p->HostBytes()), " host",
                    p->GpuBytes() > 0 ? absl::StrCat(", ", Mib(p->GpuBytes()), " GPU") : "", "\n");
    for (const MemoryPart& part : parts) {
      absl::StrAppend(&out, absl::StrFormat("#   %10s  %s%s\n", Mib(part.bytes), part.what,
                                            part.on_gpu ? " [GPU]" : ""));
    }
  }
  absl::StrAppend(&out, "# all on one machine: ", Mib(m.TotalHostBytes()), " host\n");
  return out;
}

absl::Status CheckJobFits(const JobMemory& m, int64_t available, const std::string& where) {
  const int64_t total = m.TotalHostBytes();
  if (available <= 0 || total <= available) return absl::OkStatus();
  // The side that holds the most (all its processes together) and its largest part.
  const ProcessMemory* side = &m.coordinator;
  int64_t side_bytes = m.coordinator.HostBytes();
  if (m.workers * m.worker.HostBytes() > side_bytes) {
    side = &m.worker;
    side_bytes = m.workers * m.worker.HostBytes();
  }
  if (m.feeders * m.feeder.HostBytes() > side_bytes) side = &m.feeder;
  const MemoryPart* largest = side->Largest();
  // The processes counted here (one process checking itself counts only itself).
  std::vector<std::string> counted;
  if (m.coordinator.HostBytes() > 0)
    counted.push_back("coordinator " + Mib(m.coordinator.HostBytes()));
  if (m.workers > 0) {
    counted.push_back(absl::StrCat(m.workers, " worker(s) of ", Mib(m.worker.HostBytes())));
  }
  if (m.feeders > 0) {
    counted.push_back(absl::StrCat(m.feeders, " feeder(s) of ", Mib(m.feeder.HostBytes())));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "the job needs about ", Mib(total), " of memory (", absl::StrJoin(counted, ", "), ") but ",
      where, " has ", Mib(available), " available; the largest part is the ", side->process, "'s ",
      largest->what, " (", Mib(largest->bytes),
      "): lower drafter.max_anchors, data.max_seq_len, train.global_batch_size, "
      "drafter.num_hidden_layers or the number of ",
      m.feeders > 0 ? "workers and feeders" : "workers",
      " on this machine, or train on a larger one (`flashdraft config check` shows every part)"));
}

int64_t AvailableHostMemory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace flashdraft
