#!/usr/bin/env bash
# clang's thread-safety analysis (-Wthread-safety) as errors over the coordinator's torch-free
# sources: every absl::Mutex-guarded field read or written without its lock fails the check.
# Headers elsewhere that still annotate std::mutex members (not a capability) are tolerated with
# -Wno-thread-safety-attributes until they move to absl::Mutex (issue 27). Needs build/proto (the
# generated protobuf headers) from scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d build/proto ] || { echo "thread_safety_check: run scripts/build.sh first (build/proto)"; exit 1; }
files=$(ls coordinator/*.cc | grep -v -e '/main.cc$' -e '/evaluator.cc$' -e '/initial_weights.cc$')
printf '%s\n' $files coordinator/sources/shard_source.cc | xargs -P "$(nproc)" -I{} \
  clang++ -fsyntax-only -std=c++17 -I. -Ibuild/proto -DGLOG_CUSTOM_PREFIX_SUPPORT \
    -Wthread-safety -Werror=thread-safety-analysis -Wno-thread-safety-attributes {}
echo "thread-safety analysis: $(echo $files | wc -w) coordinator sources without findings"
