// `flashdraft eval`: speculative decoding with a trained drafter against the target's own greedy
// decoding (eval.h).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cli/command.h"
#include "cli/eval.h"

namespace flashdraft {
namespace {

class EvalCommand : public Command {
 public:
  explicit EvalCommand(CLI::App& parent)
      : Command(parent.add_subcommand(
            "eval",
            "Speculative decoding with a trained drafter against the target's own greedy "
            "decoding: tau, acceptance per position, speedup, and the lossless check")) {
    EvalOptions& o = options_;
    app().add_option("--target", o.target, "Hugging Face target folder")->required();
    app()
        .add_option("--drafter", o.drafter,
                    "exported drafter folder (config.json + model.safetensors)")
        ->required();
    app()
        .add_option("--prompts", o.prompts,
                    "JSONL as prepare reads it: a chat's turns before its first assistant turn "
                    "are the prompt")
        ->required();
    app()
        .add_option("--max-new-tokens", o.max_new_tokens, "per prompt")
        ->capture_default_str()
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    app()
        .add_option("--block-size", o.block_size, "default: the drafter's")
        ->check(CLI::Range(int64_t{2}, int64_t{1024}));
    app()
        .add_option("--limit", o.limit, "the first N prompts (default: all)")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
    app()
        .add_option("--threads", o.threads, "intra-op threads")
        ->capture_default_str()
        ->check(CLI::Range(1, 1024));
    AddChatOptionFlags(app(), o.chat);
    app().add_flag("--json", o.json, "one JSON object on stdout");
    app().add_option("--json-out", o.json_out,
                     "also write that JSON to this file (flashdraft report --eval)");
    app().add_flag("--per-prompt", o.per_prompt, "a table row for every prompt");
  }

  int Run() override {
    // Tests prove the lossless check catches a decoder that accepts drafts unverified.
    const char* fault = std::getenv("FLASHDRAFT_EVAL_FAULT");
    options_.accept_unverified = fault != nullptr && std::string(fault) == "accept-drafts";
    return RunEval(options_);
  }

 private:
  EvalOptions options_;
};

}  // namespace

void AddEvalCommand(CLI::App& app, Commands& out) {
  out.push_back(std::make_unique<EvalCommand>(app));
}

}  // namespace flashdraft
