#include "common/job_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/numeric_env.h"
#include "common/status_macros.h"
#include "common/yaml_fields.h"

namespace flashdraft {
namespace {

// An OpenBLAS core name (OPENBLAS_CORETYPE), or empty.
FieldCheck<std::string> BlasKernelName() {
  return [](const std::string& v) -> std::optional<std::string> {
    if (v.empty() || ValidBlasKernelName(v)) return std::nullopt;
    return std::string(
        "must be an OpenBLAS kernel name such as Haswell, SkylakeX or Zen (letters, digits and "
        "'_', at most 32), or empty");
  };
}

using JobField = Field<JobConfig>;

#define FD_FIELD(section, key, type, ...) \
  MakeField<type, JobConfig>(             \
      #section, #key, [](JobConfig& c) -> type& { return c.section.key; }, ##__VA_ARGS__)
#define FD_TOP_FIELD(key, type, ...) \
  MakeField<type, JobConfig>(        \
      "", #key, [](JobConfig& c) -> type& { return c.key; }, ##__VA_ARGS__)

const std::vector<Field<DataSourceConfig>>& DataSourceFields() {
  static const std::vector<Field<DataSourceConfig>> fields = {
      MemberField("jsonl", &DataSourceConfig::jsonl),
      MemberField("weight", &DataSourceConfig::weight, Between(1e-6, 1e6)),
  };
  return fields;
}

absl::Status FinishDataSource(DataSourceConfig& s, const std::string& source,
                              const std::string& path) {
  if (s.jsonl.empty()) return FieldError(source, path + ".jsonl", "must be set");
  return absl::OkStatus();
}

const std::vector<JobField>& Fields() {
  static const std::vector<JobField> fields = {
      FD_TOP_FIELD(name, std::string),
      FD_TOP_FIELD(output_dir, std::string),

      FD_FIELD(target, path, std::string),
      FD_FIELD(target, layer_ids, std::vector<int>),
      FD_FIELD(target, dtype, std::string, OneOf({"float32", "bfloat16"})),
      FD_FIELD(target, device, std::string, OneOf({"cpu", "cuda"})),

      FD_FIELD(drafter, num_hidden_layers, int, Between(1, 64)),
      FD_FIELD(drafter, block_size, int, Between(2, 64)),
      FD_FIELD(drafter, num_target_features, int, Between(1, 64)),
      FD_FIELD(drafter, intermediate_size, int, AtLeast(0)),
      FD_FIELD(drafter, mask_token_id, int64_t, AtLeast<int64_t>(-1)),
      FD_FIELD(drafter, loss_decay_gamma, double, AtLeast(0.0)),
      FD_FIELD(drafter, max_anchors, int, Between(1, 1 << 16)),
      FD_FIELD(drafter, layer_types, std::vector<std::string>,
               EachOneOf({"full_attention", "sliding_attention"})),
      FD_FIELD(drafter, sliding_window, int, Between(0, 1 << 20)),
      FD_FIELD(drafter, init_from, std::string),

      FD_FIELD(data, source, std::string, OneOf({"shards", "target"})),
      FD_FIELD(data, shards_dir, std::string),
      FD_FIELD(data, jsonl, std::string),
      ListField<DataSourceConfig, JobConfig>(
          "data", "sources",
          [](JobConfig& c) -> std::vector<DataSourceConfig>& { return c.data.sources; },
          &DataSourceFields, &FinishDataSource),
      FD_FIELD(data, max_seq_len, int, Between(2, 1 << 20)),
      FD_FIELD(data, prefetch_steps, int, Between(1, 1024)),
      FD_FIELD(data, regenerate, bool),
      FD_FIELD(data, max_new_tokens, int, Between(1, 1 << 20)),
      FD_FIELD(data, enable_thinking, bool),
      FD_FIELD(data, system_prompt, MultiLineText),

      FD_FIELD(train, seed, uint64_t),
      FD_FIELD(train, learning_rate, double, Positive()),
      FD_FIELD(train, adam_beta1, double, Between(0.0, 0.999999)),
      FD_FIELD(train, adam_beta2, double, Between(0.0, 0.999999)),
      FD_FIELD(train, adam_eps, double, Positive()),
      FD_FIELD(train, weight_decay, double, AtLeast(0.0)),
      FD_FIELD(train, grad_clip_norm, double, AtLeast(0.0)),
      FD_FIELD(train, warmup_ratio, double, Between(0.0, 1.0)),
      FD_FIELD(train, lr_schedule, std::string, OneOf({"cosine", "linear", "constant", "wsd"})),
      FD_FIELD(train, decay_ratio, double, Between(0.0, 1.0)),
      FD_FIELD(train, min_lr_ratio, double, Between(0.0, 1.0)),
      FD_FIELD(train, loss, std::string, OneOf({"ce", "kl", "mix"})),
      FD_FIELD(train, ce_weight, double, Between(0.0, 1.0)),
      FD_FIELD(train, epochs, int, Between(1, 100000)),
      FD_FIELD(train, max_steps, int64_t, AtLeast<int64_t>(0)),
      FD_FIELD(train, global_batch_size, int, Between(1, 1 << 20)),
      FD_FIELD(train, intra_op_threads, int, Between(1, 1024)),
      FD_FIELD(train, deterministic_reduction, bool),
      FD_FIELD(train, virtual_shards, int, Between(0, 1 << 16)),
      FD_FIELD(train, precision, std::string, OneOf({"fp32", "bf16"})),
      FD_FIELD(train, blas_kernel, std::string, BlasKernelName()),

      FD_FIELD(cluster, listen, std::string),
      FD_FIELD(cluster, min_workers, int, Between(1, 100000)),
      FD_FIELD(cluster, max_workers, int, Between(1, 100000)),
      FD_FIELD(cluster, backend, std::string, OneOf({"gloo", "nccl"})),
      FD_FIELD(cluster, collective_interface, std::string),
      FD_FIELD(cluster, heartbeat_interval_seconds, double, Positive()),
      FD_FIELD(cluster, heartbeat_timeout_seconds, double, Positive()),
      FD_FIELD(cluster, collective_timeout_seconds, double, Positive()),
      FD_FIELD(cluster, join_timeout_seconds, double, Positive()),
      FD_FIELD(cluster, stall_timeout_seconds, double, Positive()),
      FD_FIELD(cluster, allreduce_bucket_mib, double, Between(0.001, 4096.0)),
      FD_FIELD(cluster, mixed_numerics, std::string, OneOf({"refuse", "admit"})),
      FD_FIELD(cluster, min_feeders, int, Between(0, 4096)),

      FD_FIELD(worker, device, std::string, OneOf({"cpu", "cuda"})),

      FD_FIELD(checkpoint, dir, std::string),
      FD_FIELD(checkpoint, every_steps, int, AtLeast(0)),
      FD_FIELD(checkpoint, every_seconds, double, AtLeast(0.0)),
      FD_FIELD(checkpoint, keep_last, int, AtLeast(1)),
      FD_FIELD(checkpoint, resume, bool),
      FD_FIELD(checkpoint, keep_best, bool),

      FD_FIELD(eval, every_steps, int, AtLeast(0)),
      FD_FIELD(eval, prompts, std::string),
      FD_FIELD(eval, limit, int, Between(1, 1 << 20)),
      FD_FIELD(eval, max_new_tokens, int64_t, Between<int64_t>(1, int64_t{1} << 20)),
      FD_FIELD(eval, block_size, int, Between(0, 64)),
      FD_FIELD(metrics, enabled, bool),
      FD_FIELD(metrics, listen, std::string),
      FD_FIELD(metrics, worker_listen, std::string),

      FD_FIELD(security, tls_cert, std::string),
      FD_FIELD(security, tls_key, std::string),
      FD_FIELD(security, tls_ca, std::string),
      FD_FIELD(security, client_auth, bool),
      FD_FIELD(security, client_cert, std::string),
      FD_FIELD(security, client_key, std::string),
      FD_FIELD(security, server_name, std::string),
      FD_FIELD(security, token_file, std::string),
      FD_FIELD(security, insecure, bool),
  };
  return fields;
}

const JobField* FindJobField(const std::string& section, const std::string& key) {
  return FindField(Fields(), section, key);
}

std::vector<std::string> SectionNames() {
  std::vector<std::string> out;
  for (const JobField& f : Fields()) {
    if (!f.section.empty() && (out.empty() || out.back() != f.section)) out.push_back(f.section);
  }
  return out;
}

bool IsSection(const std::string& name) {
  for (const std::string& s : SectionNames()) {
    if (s == name) return true;
  }
  return false;
}

absl::Status Invalid(const std::string& source, const std::string& field, const std::string& why) {
  return FieldError(source, field, why);
}

// The job as YAML without the fields named "section.key" in `leave_out`.
std::string EmitJobYaml(const JobConfig& config, const std::set<std::string>& leave_out) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  std::string open_section;
  for (const JobField& f : Fields()) {
    if (leave_out.count(f.section + "." + f.key) != 0) continue;
    if (f.section != open_section) {
      if (!open_section.empty()) e << YAML::EndMap;
      open_section = f.section;
      e << YAML::Key << f.section << YAML::Value << YAML::BeginMap;
    }
    e << YAML::Key << f.key << YAML::Value;
    f.emit(config, e);
  }
  if (!open_section.empty()) e << YAML::EndMap;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

// train.ce_weight weighs a mix, strictly inside (0, 1); the other losses leave it at its default.
absl::Status ValidateLoss(const TrainConfig& t, const std::string& source) {
  if (t.loss == "mix" && (t.ce_weight <= 0.0 || t.ce_weight >= 1.0)) {
    return Invalid(source, "train.ce_weight",
                   absl::StrCat("= ", t.ce_weight, " must be strictly between 0 and 1 for ",
                                "train.loss: mix (0 is kl, 1 is ce)"));
  }
  if (t.loss != "mix" && t.ce_weight != TrainConfig().ce_weight) {
    return Invalid(
        source, "train.ce_weight",
        absl::StrCat("= ", t.ce_weight, " weighs train.loss: mix, and the loss is ", t.loss));
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<double> DefaultLossDecayGamma(int block_size) {
  switch (block_size) {
    case 16:
      return 7.0;
    case 10:
      return 5.0;
    case 8:
      return 4.0;
    default:
      return std::nullopt;
  }
}

// drafter.layer_types names every layer; a sliding layer needs a window of at least a block.
absl::Status ValidateDrafterLayers(const DrafterConfig& d, const std::string& source) {
  const bool sliding =
      std::count(d.layer_types.begin(), d.layer_types.end(), "sliding_attention") > 0;
  if (!d.layer_types.empty() && static_cast<int>(d.layer_types.size()) != d.num_hidden_layers) {
    return Invalid(source, "drafter.layer_types",
                   absl::StrCat("names ", d.layer_types.size(), " layers but the drafter has ",
                                "drafter.num_hidden_layers = ", d.num_hidden_layers));
  }
  if (sliding && d.sliding_window < d.block_size) {
    return Invalid(source, "drafter.sliding_window",
                   absl::StrCat("= ", d.sliding_window, " must be at least drafter.block_size = ",
                                d.block_size, " for the sliding_attention layers"));
  }
  if (!sliding && d.sliding_window != 0) {
    return Invalid(source, "drafter.sliding_window",
                   absl::StrCat("= ", d.sliding_window,
                                " but no entry of drafter.layer_types is sliding_attention"));
  }
  return absl::OkStatus();
}

absl::Status ValidateJobConfig(const JobConfig& c, const std::string& source) {
  if (c.output_dir.empty()) return Invalid(source, "output_dir", "must not be empty");
  FD_RETURN_IF_ERROR(ValidateDrafterLayers(c.drafter, source));
  if (c.train.virtual_shards > 0 && !c.train.deterministic_reduction) {
    return Invalid(source, "train.virtual_shards",
                   absl::StrCat("= ", c.train.virtual_shards,
                                " needs train.deterministic_reduction: true (the plain all-reduce "
                                "computes one shard per worker)"));
  }
  if (c.train.virtual_shards > 0 && c.train.virtual_shards < c.cluster.max_workers) {
    return Invalid(source, "train.virtual_shards",
                   absl::StrCat("= ", c.train.virtual_shards, " is below cluster.max_workers = ",
                                c.cluster.max_workers, ": every worker needs at least one shard"));
  }
  if (c.train.lr_schedule == "wsd" && c.train.warmup_ratio + c.train.decay_ratio > 1.0) {
    return Invalid(source, "train.decay_ratio",
                   absl::StrCat("= ", c.train.decay_ratio, " and train.warmup_ratio = ",
                                c.train.warmup_ratio, " add up to more than the whole run"));
  }
  FD_RETURN_IF_ERROR(ValidateLoss(c.train, source));
  if (c.checkpoint.keep_best && c.eval.every_steps == 0) {
    return Invalid(source, "checkpoint.keep_best",
                   "needs eval.every_steps > 0: the best checkpoint is the one evaluated best");
  }
  if (c.worker.device == "cuda" && c.cluster.backend != "nccl") {
    return Invalid(source, "worker.device",
                   absl::StrCat("= cuda needs cluster.backend: nccl (it is ", c.cluster.backend,
                                "; Gloo sums host memory)"));
  }
  if (c.cluster.max_workers < c.cluster.min_workers) {
    return Invalid(source, "cluster.max_workers",
                   absl::StrCat("= ", c.cluster.max_workers,
                                " is below cluster.min_workers = ", c.cluster.min_workers));
  }
  if (c.cluster.min_feeders > 0 && c.data.source != "target") {
    return Invalid(source, "cluster.min_feeders",
                   absl::StrCat("= ", c.cluster.min_feeders, " needs data.source: target (it is ",
                                c.data.source, "): feeders compute the target's features online"));
  }
  if (c.cluster.heartbeat_timeout_seconds <= c.cluster.heartbeat_interval_seconds) {
    return Invalid(source, "cluster.heartbeat_timeout_seconds",
                   absl::StrCat("= ", c.cluster.heartbeat_timeout_seconds,
                                " must exceed cluster.heartbeat_interval_seconds = ",
                                c.cluster.heartbeat_interval_seconds));
  }
  if (c.drafter.loss_decay_gamma == 0 && !DefaultLossDecayGamma(c.drafter.block_size)) {
    return Invalid(source, "drafter.loss_decay_gamma",
                   absl::StrCat("is required for block_size ", c.drafter.block_size,
                                " (defaults exist only for 8, 10 and 16)"));
  }
  if (!c.target.layer_ids.empty()) {
    if (static_cast<int>(c.target.layer_ids.size()) != c.drafter.num_target_features) {
      return Invalid(source, "target.layer_ids",
                     absl::StrCat("has ", c.target.layer_ids.size(),
                                  " entries but drafter.num_target_features = ",
                                  c.drafter.num_target_features));
    }
    for (size_t i = 0; i < c.target.layer_ids.size(); ++i) {
      if (c.target.layer_ids[i] < 0 ||
          (i > 0 && c.target.layer_ids[i] <= c.target.layer_ids[i - 1])) {
        return Invalid(source, "target.layer_ids",
                       absl::StrCat("must be non-negative and strictly increasing; entry ", i,
                                    " is ", c.target.layer_ids[i]));
      }
    }
  }
  if (c.data.source == "shards" && c.data.shards_dir.empty()) {
    return Invalid(source, "data.shards_dir", "must be set when data.source is 'shards'");
  }
  if (c.data.source == "target") {
    if (c.target.path.empty()) {
      return Invalid(source, "target.path", "must be set when data.source is 'target'");
    }
    if (c.data.jsonl.empty() && c.data.sources.empty()) {
      return Invalid(source, "data.jsonl",
                     "or data.sources must be set when data.source is 'target'");
    }
  }
  if (!c.data.jsonl.empty() && !c.data.sources.empty()) {
    return Invalid(source, "data.sources",
                   absl::StrCat("and data.jsonl (", c.data.jsonl,
                                ") are both set: give one file as data.jsonl or a mix as "
                                "data.sources (with weight 1 for that file)"));
  }
  if (!c.data.sources.empty() && c.data.source != "target") {
    return Invalid(
        source, "data.sources",
        absl::StrCat("is a mix of chat files for data.source 'target', not '", c.data.source, "'"));
  }
  if (c.security.tls_cert.empty() != c.security.tls_key.empty()) {
    return Invalid(source, c.security.tls_cert.empty() ? "security.tls_cert" : "security.tls_key",
                   "must be set together with the other (TLS needs both certificate and key)");
  }
  if (!c.security.tls_ca.empty() && c.security.tls_cert.empty()) {
    return Invalid(source, "security.tls_ca", "needs security.tls_cert and security.tls_key");
  }
  if (c.security.client_cert.empty() != c.security.client_key.empty()) {
    return Invalid(source,
                   c.security.client_cert.empty() ? "security.client_cert" : "security.client_key",
                   "must be set together with the other");
  }
  if (!c.security.client_cert.empty() && c.security.tls_cert.empty()) {
    return Invalid(source, "security.client_cert", "needs security.tls_cert and security.tls_key");
  }
  if (c.eval.every_steps > 0) {
    if (c.eval.prompts.empty()) {
      return Invalid(source, "eval.prompts", "must be set when eval.every_steps > 0");
    }
    if (c.target.path.empty()) {
      return Invalid(source, "target.path",
                     "must be set when eval.every_steps > 0 (evaluation runs the target)");
    }
    if (c.eval.block_size > c.drafter.block_size) {
      return Invalid(source, "eval.block_size",
                     absl::StrCat("= ", c.eval.block_size,
                                  " exceeds drafter.block_size = ", c.drafter.block_size));
    }
  }
  auto check_listen = [&source](const char* field, const std::string& listen) -> absl::Status {
    const size_t colon = listen.rfind(':');
    int port = -1;
    if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
        port < 0 || port > 65535) {
      return Invalid(source, field,
                     absl::StrCat("'", listen, "' is not HOST:PORT (port 0-65535; 0 picks one)"));
    }
    return absl::OkStatus();
  };
  if (c.metrics.enabled) {
    FD_RETURN_IF_ERROR(check_listen("metrics.listen", c.metrics.listen));
    if (!c.metrics.worker_listen.empty()) {
      FD_RETURN_IF_ERROR(check_listen("metrics.worker_listen", c.metrics.worker_listen));
    }
  }
  // Secure by default: a port other hosts can reach needs TLS and the job secret.
  if (!IsLoopbackListen(c.cluster.listen) && !c.security.insecure &&
      (c.security.tls_cert.empty() || c.security.token_file.empty())) {
    return Invalid(
        source, "cluster.listen",
        absl::StrCat("'", c.cluster.listen,
                     "' accepts connections from other hosts, which needs TLS and a job secret: "
                     "set security.tls_cert, security.tls_key and security.token_file "
                     "(deploy/make-certs.sh makes them; docs/SECURITY.md), or "
                     "security.insecure: true on a network you trust completely"));
  }
  return absl::OkStatus();
}

bool IsLoopbackListen(const std::string& listen) {
  std::string host = listen;
  if (absl::StartsWith(host, "[")) {  // [v6]:port
    host = host.substr(1, host.find(']') == std::string::npos ? 0 : host.find(']') - 1);
  } else if (size_t colon = host.rfind(':'); colon != std::string::npos) {
    host = host.substr(0, colon);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

bool OffersBackend(const std::string& offered, const std::string& backend) {
  if (offered.empty()) return backend == "gloo";
  const std::vector<std::string> backends = absl::StrSplit(offered, ',');
  return std::find(backends.begin(), backends.end(), backend) != backends.end();
}

std::string JobFingerprint(const JobConfig& c) {
  JobConfig same;  // defaults everywhere but what defines the run
  same.target = c.target;
  same.drafter = c.drafter;
  same.data = c.data;
  same.train = c.train;
  same.train.max_steps = 0;
  same.train.epochs = 1;
  same.train.intra_op_threads = 1;
  same.train.deterministic_reduction = true;
  same.train.virtual_shards = 0;
  // Where and in which precision the arithmetic runs: weights and optimizer state are fp32 either
  // way, so a run may resume on other devices or in the other precision.
  same.train.precision = "fp32";
  same.train.blas_kernel.clear();  // a resume under another kernel says so (docs/determinism.md)
  same.target.device = "cpu";
  // Fields that say how a run computes, not what it computes, and came after checkpoints recorded
  // fingerprints: left out, so that those checkpoints still resume (a new field of this kind goes
  // here too; JobConfigTest.FingerprintOfAFixedJobNeverChanges holds the value).
  std::set<std::string> leave_out = {"train.blas_kernel", "cluster.mixed_numerics",
                                     "cluster.min_feeders", "checkpoint.keep_best"};
  // Fields of what a run computes that came after checkpoints recorded fingerprints: in the
  // fingerprint only when they differ from their default (which is what those runs computed).
  const TrainConfig defaults;
  if (c.train.lr_schedule == defaults.lr_schedule) leave_out.insert("train.lr_schedule");
  if (c.train.decay_ratio == defaults.decay_ratio) leave_out.insert("train.decay_ratio");
  if (c.train.min_lr_ratio == defaults.min_lr_ratio) leave_out.insert("train.min_lr_ratio");
  if (c.train.loss == defaults.loss) {  // ce_weight weighs only a mix
    leave_out.insert("train.loss");
    leave_out.insert("train.ce_weight");
  }
  const DataConfig data_defaults;
  if (c.data.enable_thinking == data_defaults.enable_thinking) {
    leave_out.insert("data.enable_thinking");
  }
  if (c.data.system_prompt.empty()) leave_out.insert("data.system_prompt");
  if (c.data.sources.empty()) leave_out.insert("data.sources");
  if (c.drafter.sliding_window == 0) {  // no sliding layer: the list, if any, is all full
    leave_out.insert("drafter.layer_types");
    leave_out.insert("drafter.sliding_window");
  }
  const std::string yaml = EmitJobYaml(same, leave_out);
  return absl::StrFormat("%08x", Crc32c(yaml.data(), yaml.size()));
}

int64_t EffectiveVirtualShards(const JobConfig& c) {
  if (!c.train.deterministic_reduction) return 0;
  if (c.train.virtual_shards > 0) return c.train.virtual_shards;
  return std::max(8, c.cluster.max_workers);
}

double LossCeWeight(const TrainConfig& t) {
  if (t.loss == "kl") return 0.0;
  return t.loss == "mix" ? t.ce_weight : 1.0;
}

double EffectiveLossDecayGamma(const JobConfig& c) {
  if (c.drafter.loss_decay_gamma > 0) return c.drafter.loss_decay_gamma;
  return DefaultLossDecayGamma(c.drafter.block_size).value_or(7.0);
}

absl::StatusOr<JobConfig> ParseJobConfig(const std::string& yaml_text, const std::string& source) {
  FD_ASSIGN_OR_RETURN(const YAML::Node root, LoadYaml(yaml_text, source));
  JobConfig config;
  if (root.IsNull()) {
    FD_RETURN_IF_ERROR(ValidateJobConfig(config, source));
    return config;
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the job file must be a mapping"));
  }
  for (const auto& entry : root) {
    FD_ASSIGN_OR_RETURN(const std::string key, KeyName(entry.first, source));
    const YAML::Node& value = entry.second;
    if (IsSection(key)) {
      if (value.IsNull()) continue;
      if (!value.IsMap()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": section '", key, "' must be a mapping"));
      }
      FD_RETURN_IF_ERROR(ReadMapping(value, Fields(), key, source, key, config));
      continue;
    }
    const JobField* f = FindJobField("", key);
    if (f == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": unknown field '", key,
                                                     "' (known: ", KeysOf(Fields(), ""), ", ",
                                                     absl::StrJoin(SectionNames(), ", "), ")"));
    }
    FD_RETURN_IF_ERROR(f->set(config, value, source, f->path()));
  }
  FD_RETURN_IF_ERROR(ValidateJobConfig(config, source));
  return config;
}

absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path) {
  FD_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseJobConfig(text, path);
}

absl::Status ApplyOverrides(JobConfig& config, const std::vector<std::string>& assignments) {
  JobConfig updated = config;
  for (const std::string& assignment : assignments) {
    const size_t eq = assignment.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("override '", assignment, "' must look like section.field=value"));
    }
    const std::string path = assignment.substr(0, eq);
    const std::string text = assignment.substr(eq + 1);
    std::vector<std::string> parts = absl::StrSplit(path, '.');
    const JobField* f = nullptr;
    if (parts.size() == 1) f = FindJobField("", parts[0]);
    if (parts.size() == 2) f = FindJobField(parts[0], parts[1]);
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("override '", assignment, "': unknown field '", path, "'"));
    }
    YAML::Node node;
    try {
      node = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("override '", assignment, "': value is not valid YAML: ", e.what()));
    }
    FD_RETURN_IF_ERROR(f->set(updated, node, "override", f->path()));
  }
  // Validated together: fields that go in pairs (tls_cert and tls_key) may come in two overrides.
  FD_RETURN_IF_ERROR(ValidateJobConfig(updated, "override"));
  config = std::move(updated);
  return absl::OkStatus();
}

std::string JobConfigToYaml(const JobConfig& config) { return EmitJobYaml(config, {}); }

}  // namespace flashdraft
