// `flashdraft prepare`: offline shards from a Hugging Face target and JSONL chat data (prepare.h).
#include <cstdint>
#include <string>

#include "cli/command.h"
#include "cli/prepare.h"

namespace flashdraft {
namespace {

class PrepareCommand : public Command {
 public:
  explicit PrepareCommand(CLI::App& parent)
      : Command(parent.add_subcommand(
            "prepare", "Offline shards from a Hugging Face target and JSONL chat data")) {
    PrepareOptions& o = options_;
    app().add_option("--target", o.target, "Hugging Face model folder")->required();
    app().add_option(
        "--data", o.data,
        "JSONL: per line {\"input_ids\", \"loss_mask\"}, {\"messages\"} (role/content) "
        "or {\"conversations\"} (ShareGPT from/value)");
    app().add_option("--import-specforge", o.import_specforge,
                     "instead of --data: a folder of SpecForge offline samples (torch.save dicts "
                     "of input_ids, loss_mask, hidden_states)");
    app().add_option("--out", o.out, "output directory")->required();
    app().add_option("--layers", layers_, "target layer ids, e.g. 1,9,17,25,33");
    app()
        .add_option("--num-features", o.num_features,
                    "number of target layers when --layers is not given")
        ->capture_default_str();
    app().add_option("--mask-token-id", o.mask_token_id,
                     "MASK id (default: the embedding table's last row)");
    app().add_option("--max-seq-len", o.max_seq_len, "truncate samples")->capture_default_str();
    app().add_option("--samples-per-shard", o.samples_per_shard, "")->capture_default_str();
    app().add_flag("--skip-bad-lines", o.skip_bad_lines,
                   "report bad JSONL lines and go on (default: the first is fatal)");
    app().add_flag("--float32", o.float32_features, "F32 features instead of BF16");
    app().add_flag("--teacher", o.teacher,
                   "also store the target's final-normed last hidden state (hidden_size values "
                   "per token), which train.loss kl and mix distil from");
    app().add_option("--tokenizer", o.tokenizer,
                     "tokenizer.json for chat lines (default: <target>/tokenizer.json)");
    app().add_flag("--regenerate", o.regenerate,
                   "replace assistant turns by the target's own greedy answers");
    app()
        .add_option("--max-new-tokens", o.max_new_tokens, "longest regenerated answer, in tokens")
        ->capture_default_str()
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    AddChatOptionFlags(app(), o.chat);
  }

  int Run() override {
    if (absl::Status s = ParseLayerIds(layers_, options_.layer_ids); !s.ok()) return Fail(s);
    return ExitCode(Prepare(options_));
  }

 private:
  PrepareOptions options_;
  std::string layers_;
};

}  // namespace

void AddPrepareCommand(CLI::App& app, Commands& out) {
  out.push_back(std::make_unique<PrepareCommand>(app));
}

}  // namespace flashdraft
