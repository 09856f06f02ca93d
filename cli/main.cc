// flashdraft — the command-line tool. Subcommands that exist today:
//   flashdraft config check JOB.yaml [--set section.field=value ...]   validate a job file, print
//   it flashdraft inspect PATH                                            list a safetensors
//   file/model flashdraft version
// (launch, debug, prepare, eval and export arrive with their issues.)
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/eval.h"
#include "cli/launch.h"
#include "cli/make_shards.h"
#include "cli/make_target.h"
#include "cli/make_tiny_target.h"
#include "cli/prepare.h"
#include "cli/pve.h"
#include "cli/report.h"
#include "cli/security_flags.h"
#include "cli/train_synthetic.h"
#include "common/crc32c.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/safetensors.h"
#include "coordinator/checkpoint.h"
#include "flashdraft/v1/coordinator.grpc.pb.h"
#include "model/debug_step.h"
#include "model/drafter_export.h"
#include "model/memory_estimate.h"

namespace flashdraft {
namespace {

int Fail(const absl::Status& status) {
  std::cerr << "flashdraft: error: " << status.message() << "\n";
  return 1;
}

// "1,9,17" → {1, 9, 17}.
absl::Status ParseLayerIds(const std::string& text, std::vector<int>& out) {
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError("--layers: '" + std::string(part) + "' is not an integer");
    }
    out.push_back(id);
  }
  return absl::OkStatus();
}

// A failed call to the coordinator at `address`, said plainly.
absl::Status CallFailed(const std::string& address, const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return absl::UnauthenticatedError(
        absl::StrCat("the coordinator at ", address, " ", s.error_message(), " (--token-file)"));
  }
  return absl::UnavailableError(
      absl::StrCat("no coordinator answering at ", address, ": ", s.error_message()));
}

// `flashdraft status ADDR --drain WORKER`: WORKER is a rank of the current epoch or a worker id.
int Drain(const std::string& address, const ClientSecurity& security, const std::string& worker) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateSecureChannel(address, security);
  if (!channel.ok()) return Fail(channel.status());
  auto stub = v1::Coordinator::NewStub(*channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::DrainRequest request;
  uint32_t rank = 0;
  if (absl::SimpleAtoi(worker, &rank)) {
    request.set_rank(rank);
  } else {
    request.set_worker_id(worker);
  }
  v1::DrainReply reply;
  grpc::Status s = stub->Drain(&ctx, request, &reply);
  if (!s.ok()) return Fail(CallFailed(address, s));
  if (!reply.accepted())
    return Fail(absl::NotFoundError("--drain " + worker + ": " + reply.message()));
  std::printf("%s\n", reply.message().c_str());
  return 0;
}

// "45s", "4m05s", "2h03m".
std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

// The status as a person reads it at a glance.
std::string FormatStatus(const v1::StatusReply& r) {
  std::string out =
      absl::StrFormat("job %s  state %s  step %d/%d  workers %d  epoch %d\n", r.job_name(),
                      r.state(), r.step(), r.total_steps(), r.world_size(), r.membership_epoch());
  if (r.step() > 0) {
    absl::StrAppendFormat(&out, "  %.0f%% done",
                          100.0 * r.step() / std::max<uint64_t>(1, r.total_steps()));
    if (r.eta_seconds() > 0 && r.state() == "training") {
      absl::StrAppend(&out, ", ETA ", Duration(r.eta_seconds()));
    }
    absl::StrAppendFormat(&out, "   loss %.4f  tau %.3f  %.0f tok/s  %.3f s/step\n", r.loss(),
                          r.tau_estimate(), r.tokens_per_second(), r.step_seconds());
  }
  if (r.last_checkpoint_step() == 0) {
    absl::StrAppend(&out, "  last checkpoint: none yet\n");
  } else if (r.last_checkpoint_age_seconds() < 0) {
    absl::StrAppend(&out, "  last checkpoint: step ", r.last_checkpoint_step(),
                    " (resumed from it)\n");
  } else {
    absl::StrAppend(&out, "  last checkpoint: step ", r.last_checkpoint_step(), ", ",
                    Duration(r.last_checkpoint_age_seconds()), " ago\n");
  }
  if (r.workers_size() > 0) {
    absl::StrAppendFormat(&out, "  %-24s %-7s %4s  %-10s %7s %8s %10s\n", "WORKER", "STATE", "RANK",
                          "PHASE", "STEP", "HEARD", "STEP TIME");
  }
  for (const v1::WorkerStatus& w : r.workers()) {
    absl::StrAppendFormat(&out, "  %-24s %-7s %4s  %-10s %7d %7.1fs %10s%s\n", w.worker_id(),
                          w.state(), w.rank() >= 0 ? absl::StrCat(w.rank()) : "-", w.phase(),
                          w.step(), w.seconds_since_heard(),
                          w.step_seconds() > 0 ? absl::StrFormat("%.3fs", w.step_seconds()) : "-",
                          w.leaving() ? "  (leaving)" : "");
  }
  return out;
}

// `flashdraft status ADDR [--json] [--watch SECONDS]`.
int PrintStatus(const std::string& address, const ClientSecurity& security, bool json,
                double watch_seconds) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateSecureChannel(address, security);
  if (!channel.ok()) return Fail(channel.status());
  auto stub = v1::Coordinator::NewStub(*channel);
  const bool terminal = isatty(STDOUT_FILENO) == 1;
  for (int round = 0;; ++round) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::StatusReply reply;
    grpc::Status s = stub->Status(&ctx, v1::StatusRequest(), &reply);
    // Once it answered: a coordinator shutting down cancels the call, a gone one is unavailable.
    if (!s.ok() && round > 0 &&
        (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::CANCELLED)) {
      std::printf("the coordinator at %s is gone: the job ended or it was stopped\n",
                  address.c_str());
      return 0;
    }
    if (!s.ok()) {
      absl::Status failed = CallFailed(address, s);
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
        failed = absl::UnavailableError(
            absl::StrCat(failed.message(),
                         " (a finished job's coordinator exits: its results are in the "
                         "job's output_dir)"));
      }
      return Fail(failed);
    }
    if (json) {
      std::string text;
      google::protobuf::util::JsonPrintOptions options;
      options.preserve_proto_field_names = true;
      options.always_print_primitive_fields = true;
      (void)google::protobuf::util::MessageToJsonString(reply, &text, options);
      std::printf("%s\n", text.c_str());
    } else {
      if (watch_seconds > 0 && terminal) std::printf("\033[H\033[2J");  // in place
      std::printf("%s", FormatStatus(reply).c_str());
    }
    std::fflush(stdout);
    if (watch_seconds <= 0 || reply.state() == "done" || reply.state() == "failed") return 0;
    if (!terminal && !json) std::printf("\n");
    std::this_thread::sleep_for(
        std::chrono::milliseconds(static_cast<int64_t>(watch_seconds * 1000)));
  }
}

int ConfigCheck(const std::string& path, const std::vector<std::string>& overrides) {
  absl::StatusOr<JobConfig> config = LoadJobConfig(path);
  if (!config.ok()) return Fail(config.status());
  if (absl::Status s = ApplyOverrides(*config, overrides); !s.ok()) return Fail(s);
  std::cout << "# " << path << ": valid\n";
  // Each process's expected peak memory, where the target's (or the shards') files are here.
  absl::StatusOr<MemoryInputs> inputs = MemoryInputsForJob(*config);
  if (inputs.ok()) {
    std::cout << FormatJobMemory(EstimateJobMemory(*config, *inputs, config->cluster.max_workers));
  } else {
    std::cout << "# memory estimate: not available (" << inputs.status().message() << ")\n";
  }
  std::cout << JobConfigToYaml(*config);
  return 0;
}

int Inspect(const std::string& path) {
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> model = SafetensorsModel::Open(path);
  if (!model.ok()) return Fail(model.status());
  uint64_t total = 0;
  std::printf("%-60s %-5s %-22s %14s %10s\n", "tensor", "dtype", "shape", "bytes", "crc32c");
  for (const std::string& name : (*model)->names()) {
    TensorView v = *(*model)->Get(name);
    std::printf("%-60s %-5s %-22s %14zu   %08x\n", name.c_str(),
                std::string(DTypeName(v.dtype)).c_str(), ShapeString(v.shape).c_str(), v.nbytes,
                Crc32c(v.data, v.nbytes));
    total += v.nbytes;
  }
  std::printf("%zu tensors, %llu bytes\n", (*model)->names().size(),
              static_cast<unsigned long long>(total));
  return 0;
}

}  // namespace
}  // namespace flashdraft

int main(int argc, char** argv) {
  flashdraft::InitLogging(argv[0]);
  CLI::App app{"flashdraft: distributed training of DFlash speculative-decoding drafters"};
  app.require_subcommand(1);

  CLI::App* config = app.add_subcommand("config", "Job file tools");
  config->require_subcommand(1);
  CLI::App* check = config->add_subcommand("check", "Validate a job file and print it in full");
  std::string job_path;
  std::vector<std::string> overrides;
  check->add_option("job", job_path, "YAML job file")->required();
  check->add_option("--set", overrides, "Override a field: section.field=value (repeatable)");

  CLI::App* inspect = app.add_subcommand(
      "inspect", "List the tensors of a safetensors file or Hugging Face model folder");
  std::string inspect_path;
  inspect->add_option("path", inspect_path, "file.safetensors or model folder")->required();

  CLI::App* debug = app.add_subcommand("debug", "Tools for chasing numerics bugs");
  debug->require_subcommand(1);
  CLI::App* step = debug->add_subcommand(
      "drafter-step",
      "One drafter forward+backward on files: writes loss, slot accuracy, gradients");
  flashdraft::DrafterStepFiles step_files;
  double gamma = 0;
  step->add_option("--config", step_files.config, "HF-style drafter config.json")->required();
  step->add_option("--weights", step_files.weights,
                   "drafter weights + embed_tokens.weight (+ lm_head.weight)")
      ->required();
  step->add_option("--batch", step_files.batch,
                   "input_ids, loss_mask, hidden_states, anchors (safetensors)")
      ->required();
  step->add_option("--out", step_files.out, "output safetensors")->required();
  CLI::Option* gamma_opt =
      step->add_option("--gamma", gamma, "loss decay (default 7/5/4 for block size 16/10/8)");

  CLI::App* features = debug->add_subcommand(
      "target-features", "Run a target model on input_ids: per-layer hidden states and logits");
  std::string target_dir, ids_path, layers_text, features_out;
  features->add_option("--target", target_dir, "Hugging Face model folder")->required();
  features->add_option("--ids", ids_path, "safetensors with input_ids [b,S] I64")->required();
  features->add_option("--layers", layers_text, "decoder layer ids, e.g. 1,3,5")->required();
  features->add_option("--out", features_out, "output safetensors")->required();
  bool dense_attention = false;
  features->add_flag("--dense-attention", dense_attention,
                     "whole [S, S] score matrices instead of tiles (memory quadratic in S)");

  CLI::App* synth = debug->add_subcommand(
      "train-synthetic", "Train a drafter in this process on a synthetic learnable language");
  flashdraft::SyntheticTrainingOptions synth_options;
  synth->add_option("--steps", synth_options.steps, "training steps")->capture_default_str();
  synth->add_option("--block-size", synth_options.block_size, "8, 10 or 16")->capture_default_str();
  synth->add_option("--hidden", synth_options.hidden_size, "drafter hidden size")
      ->capture_default_str();
  synth->add_option("--layers", synth_options.layers, "drafter layers")->capture_default_str();
  synth->add_option("--noise", synth_options.noise, "probability of a random next token")
      ->capture_default_str();
  synth->add_option("--lr", synth_options.learning_rate, "peak learning rate")
      ->capture_default_str();
  synth->add_option("--seed", synth_options.seed, "seed")->capture_default_str();
  synth->add_option("--threads", synth_options.threads, "intra-op threads")->capture_default_str();
  synth->add_option("--out", synth_options.out_dir, "directory for steps.jsonl");

  CLI::App* launch = app.add_subcommand(
      "launch", "Run a job here: the coordinator and N workers as child processes");
  flashdraft::LaunchOptions launch_options;
  launch->add_option("job", launch_options.job_path, "YAML job file")->required();
  launch->add_option("--workers", launch_options.workers, "worker processes")
      ->capture_default_str();
  launch->add_option("--out", launch_options.out_dir, "output directory (overrides output_dir)");
  launch->add_option("--set", launch_options.overrides, "override a field: section.field=value");
  launch->add_flag("--skip-memory-check", launch_options.skip_memory_check,
                   "start even when the job's expected peak memory exceeds what is available");
  bool resume = false;
  launch->add_flag("--resume", resume,
                   "start from the newest checkpoint when there is one (checkpoint.resume=true)");
  launch
      ->add_option("--max-restarts", launch_options.max_restarts,
                   "start a crashed worker again up to this many times (1 s, 2 s, 4 s ... later)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  launch->add_option(
      "--threads", launch_options.threads_per_worker,
      "intra-op threads of every worker (default: the job's train.intra_op_threads)");

  CLI::App* shards = app.add_subcommand(
      "make-shards", "Write a synthetic learnable data set as offline shards (demo, tests)");
  flashdraft::MakeShardsOptions shard_options;
  shards->add_option("--out", shard_options.out, "output directory")->required();
  shards->add_option("--samples", shard_options.samples, "samples")->capture_default_str();
  shards->add_option("--seq", shard_options.seq_len, "longest sample")->capture_default_str();
  shards->add_option("--vocab", shard_options.vocab_size, "vocabulary")->capture_default_str();
  shards->add_option("--hidden", shard_options.hidden_size, "target hidden size")
      ->capture_default_str();
  shards->add_option("--noise", shard_options.noise, "probability of a random next token")
      ->capture_default_str();
  shards->add_option("--seed", shard_options.seed, "seed")->capture_default_str();

  CLI::App* tiny = app.add_subcommand(
      "make-tiny-target",
      "Create a small Qwen3-shaped Hugging Face target trained on Debian's license texts");
  flashdraft::MakeTinyTargetOptions tiny_options;
  tiny->add_option("--out", tiny_options.out, "output folder")->required();
  tiny->add_option("--steps", tiny_options.steps, "training steps")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{10000000}));
  tiny->add_option("--merges", tiny_options.num_merges, "BPE merges")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  tiny->add_option("--hidden", tiny_options.hidden_size, "hidden size")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{8}, int64_t{4096}));
  tiny->add_option("--layers", tiny_options.num_layers, "decoder layers")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  tiny->add_option("--corpus", tiny_options.corpus_dir, "folder of text files")
      ->capture_default_str();
  tiny->add_option("--threads", tiny_options.threads, "intra-op threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  tiny->add_option("--seed", tiny_options.seed, "seed")->capture_default_str();
  tiny->add_flag("--force", tiny_options.force, "retrain even if the folder is up to date");

  CLI::App* make_target = app.add_subcommand(
      "make-target", "Create a random-weight Hugging Face target of a real model's shape");
  flashdraft::MakeTargetOptions target_options;
  make_target
      ->add_option(
          "--shape", target_options.shape,
          absl::StrCat("the real model: ", absl::StrJoin(flashdraft::TargetShapeNames(), ", ")))
      ->required();
  make_target->add_option("--out", target_options.out, "output folder")->required();
  make_target->add_option("--layers", target_options.layers,
                          "decoder layers (default: the real model's)");
  make_target->add_option("--dtype", target_options.dtype, "weights: bf16 or fp32")
      ->capture_default_str();
  make_target->add_option(
      "--max-seq-len", target_options.max_seq_len,
      "the tokenizer's model_max_length and the reply length of long-chats.jsonl (default 2048)");
  make_target->add_option("--corpus", target_options.corpus_dir, "folder of text files")
      ->capture_default_str();
  make_target->add_option("--seed", target_options.seed, "seed")->capture_default_str();
  make_target->add_flag("--force", target_options.force, "make it again even if up to date");

  CLI::App* prepare = app.add_subcommand(
      "prepare", "Offline shards from a Hugging Face target and JSONL chat data");
  flashdraft::PrepareOptions prepare_options;
  std::string prepare_layers;
  prepare->add_option("--target", prepare_options.target, "Hugging Face model folder")->required();
  prepare->add_option(
      "--data", prepare_options.data,
      "JSONL: per line {\"input_ids\", \"loss_mask\"}, {\"messages\"} (role/content) "
      "or {\"conversations\"} (ShareGPT from/value)");
  prepare->add_option("--import-specforge", prepare_options.import_specforge,
                      "instead of --data: a folder of SpecForge offline samples (torch.save dicts "
                      "of input_ids, loss_mask, hidden_states)");
  prepare->add_option("--out", prepare_options.out, "output directory")->required();
  prepare->add_option("--layers", prepare_layers, "target layer ids, e.g. 1,9,17,25,33");
  prepare
      ->add_option("--num-features", prepare_options.num_features,
                   "number of target layers when --layers is not given")
      ->capture_default_str();
  prepare->add_option("--mask-token-id", prepare_options.mask_token_id,
                      "MASK id (default: the embedding table's last row)");
  prepare->add_option("--max-seq-len", prepare_options.max_seq_len, "truncate samples")
      ->capture_default_str();
  prepare->add_option("--samples-per-shard", prepare_options.samples_per_shard, "")
      ->capture_default_str();
  prepare->add_flag("--skip-bad-lines", prepare_options.skip_bad_lines,
                    "report bad JSONL lines and go on (default: the first is fatal)");
  prepare->add_flag("--float32", prepare_options.float32_features, "F32 features instead of BF16");
  prepare->add_option("--tokenizer", prepare_options.tokenizer,
                      "tokenizer.json for chat lines (default: <target>/tokenizer.json)");
  prepare->add_flag("--regenerate", prepare_options.regenerate,
                    "replace assistant turns by the target's own greedy answers");
  prepare
      ->add_option("--max-new-tokens", prepare_options.max_new_tokens,
                   "longest regenerated answer, in tokens")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));

  CLI::App* eval = app.add_subcommand(
      "eval",
      "Speculative decoding with a trained drafter against the target's own greedy decoding: "
      "tau, acceptance per position, speedup, and the lossless check");
  flashdraft::EvalOptions eval_options;
  eval->add_option("--target", eval_options.target, "Hugging Face target folder")->required();
  eval->add_option("--drafter", eval_options.drafter,
                   "exported drafter folder (config.json + model.safetensors)")
      ->required();
  eval->add_option("--prompts", eval_options.prompts,
                   "JSONL as prepare reads it: a chat's turns before its first assistant turn are "
                   "the prompt")
      ->required();
  eval->add_option("--max-new-tokens", eval_options.max_new_tokens, "per prompt")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  eval->add_option("--block-size", eval_options.block_size, "default: the drafter's")
      ->check(CLI::Range(int64_t{2}, int64_t{1024}));
  eval->add_option("--limit", eval_options.limit, "the first N prompts (default: all)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  eval->add_option("--threads", eval_options.threads, "intra-op threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  eval->add_flag("--json", eval_options.json, "one JSON object on stdout");
  eval->add_option("--json-out", eval_options.json_out,
                   "also write that JSON to this file (flashdraft report --eval)");
  eval->add_flag("--per-prompt", eval_options.per_prompt, "a table row for every prompt");

  CLI::App* report = app.add_subcommand(
      "report", "One self-contained HTML page of a job: curves, phases, workers, eval, config");
  flashdraft::ReportOptions report_options;
  report->add_option("--job", report_options.job_dir, "the job's output_dir (steps.jsonl)")
      ->required();
  report->add_option("--eval", report_options.eval, "JSON of `flashdraft eval --json`");
  report->add_option("--out", report_options.out, "HTML file to write")->required();

  CLI::App* status = app.add_subcommand("status", "Ask a running coordinator how the job is going");
  std::string status_address;
  status->add_option("coordinator", status_address, "host:port")->required();
  std::string drain_worker;
  status->add_option("--drain", drain_worker,
                     "make this worker (a rank of the current epoch, or a worker id) leave at "
                     "the next step boundary");
  bool status_json = false;
  status->add_flag("--json", status_json, "print the coordinator's reply as JSON (for scripts)");
  double status_watch = 0;
  status
      ->add_option("--watch", status_watch,
                   "refresh every SECONDS (in place on a terminal) until the job ends")
      ->check(CLI::Range(0.1, 3600.0));
  flashdraft::ClientSecurity status_security;
  std::string status_job;
  flashdraft::AddClientSecurityFlags(*status, status_security, status_job);

  CLI::App* export_cmd = app.add_subcommand(
      "export", "Write the drafter folder SGLang, vLLM and the z-lab code load from a checkpoint");
  std::string export_checkpoint, export_out;
  export_cmd
      ->add_option("--checkpoint", export_checkpoint,
                   "a checkpoint directory (step-N under the job's checkpoint.dir)")
      ->required();
  export_cmd->add_option("--out", export_out, "the folder to write")->required();

  CLI::App* pve = app.add_subcommand(
      "pve", "Deploy a job into Proxmox LXC containers over ssh (deploy/proxmox/flashdraft-pve)");
  flashdraft::PveOptions pve_options;
  pve->add_option("command", pve_options.command, "deploy | status | stop | rollback")
      ->required()
      ->check(CLI::IsMember({"deploy", "status", "stop", "rollback"}));
  pve->add_option("cluster", pve_options.cluster_path,
                  "cluster file (deploy/proxmox/cluster.example.yaml)")
      ->required();
  pve->add_option("job", pve_options.job_path, "YAML job file")->required();
  pve->add_flag("--dry-run", pve_options.dry_run, "print every command instead of running it");
  pve->add_option("--state", pve_options.state_dir,
                  "local directory for the job's certificates and bundles (default: "
                  "flashdraft-pve-<job name> next to the cluster file)");
  pve->add_option("--deploy-dir", pve_options.deploy_dir,
                  "the project's deploy/ directory (systemd units, make-certs.sh); default: found "
                  "next to this program");
  pve->add_option("--join-timeout", pve_options.join_timeout_seconds,
                  "seconds to wait for every worker to join")
      ->capture_default_str();

  app.add_subcommand("version", "Print the version");

  CLI11_PARSE(app, argc, argv);
  if (check->parsed()) return flashdraft::ConfigCheck(job_path, overrides);
  if (report->parsed()) {
    if (absl::Status s = flashdraft::WriteReport(report_options); !s.ok()) {
      return flashdraft::Fail(s);
    }
    std::printf("wrote %s\n", report_options.out.c_str());
    return 0;
  }
  if (eval->parsed()) {
    const char* fault = std::getenv("FLASHDRAFT_EVAL_FAULT");
    eval_options.accept_unverified = fault != nullptr && std::string(fault) == "accept-drafts";
    return flashdraft::RunEval(eval_options);
  }
  if (inspect->parsed()) return flashdraft::Inspect(inspect_path);
  if (step->parsed()) {
    if (gamma_opt->count() > 0) step_files.gamma = gamma;
    absl::Status s = flashdraft::RunDrafterDebugStep(step_files);
    if (!s.ok()) return flashdraft::Fail(s);
    std::printf("wrote %s\n", step_files.out.c_str());
    return 0;
  }
  if (launch->parsed()) {
    if (resume) {
      launch_options.overrides.push_back("checkpoint.resume=true");
      launch_options.restart_coordinator = true;
    }
    return flashdraft::Launch(launch_options);
  }
  if (status->parsed()) {
    absl::StatusOr<flashdraft::ClientSecurity> security =
        flashdraft::ClientSecurityFromJob(status_job, status_security);
    if (!security.ok()) return flashdraft::Fail(security.status());
    if (!drain_worker.empty()) return flashdraft::Drain(status_address, *security, drain_worker);
    return flashdraft::PrintStatus(status_address, *security, status_json, status_watch);
  }
  if (export_cmd->parsed()) {
    absl::StatusOr<flashdraft::CheckpointInfo> checkpoint =
        flashdraft::OpenCheckpoint(export_checkpoint);
    if (!checkpoint.ok()) return flashdraft::Fail(checkpoint.status());
    if (absl::Status s = flashdraft::ExportCheckpoint(checkpoint->dir, export_out); !s.ok()) {
      return flashdraft::Fail(s);
    }
    std::printf("exported the drafter after step %llu to %s\n",
                static_cast<unsigned long long>(checkpoint->completed_steps), export_out.c_str());
    return 0;
  }
  if (pve->parsed()) {
    if (pve_options.deploy_dir.empty()) pve_options.deploy_dir = flashdraft::FindDeployDir();
    return flashdraft::RunPve(pve_options);
  }
  if (prepare->parsed()) {
    if (absl::Status s = flashdraft::ParseLayerIds(prepare_layers, prepare_options.layer_ids);
        !s.ok()) {
      return flashdraft::Fail(s);
    }
    absl::Status s = flashdraft::Prepare(prepare_options);
    return s.ok() ? 0 : flashdraft::Fail(s);
  }
  if (make_target->parsed()) {
    absl::Status s = flashdraft::MakeTarget(target_options);
    return s.ok() ? 0 : flashdraft::Fail(s);
  }
  if (tiny->parsed()) {
    absl::Status s = flashdraft::MakeTinyTarget(tiny_options);
    return s.ok() ? 0 : flashdraft::Fail(s);
  }
  if (shards->parsed()) {
    absl::Status s = flashdraft::MakeShards(shard_options);
    return s.ok() ? 0 : flashdraft::Fail(s);
  }
  if (features->parsed()) {
    std::vector<int> layers;
    if (absl::Status s = flashdraft::ParseLayerIds(layers_text, layers); !s.ok()) {
      return flashdraft::Fail(s);
    }
    absl::Status s = flashdraft::RunTargetFeaturesDebug(target_dir, ids_path, layers, features_out,
                                                        dense_attention);
    if (!s.ok()) return flashdraft::Fail(s);
    std::printf("wrote %s\n", features_out.c_str());
    return 0;
  }
  if (synth->parsed()) {
    absl::Status s = flashdraft::RunSyntheticTraining(synth_options);
    return s.ok() ? 0 : flashdraft::Fail(s);
  }
  if (app.got_subcommand("version")) {
    std::printf("flashdraft %s\n", FLASHDRAFT_VERSION);
    return 0;
  }
  return 1;
}
