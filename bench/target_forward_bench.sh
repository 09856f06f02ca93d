#!/usr/bin/env bash
# Target forward (Qwen3-shaped, hidden 512, 8 layers, vocab 32000, fp32; features of layers 1,3,5 +
# logits): flashdraft's TargetModel vs PyTorch eager on the same LibTorch, same threads, same run.
#   bench/target_forward_bench.sh [--threads 2] [--batch 4] [--seq 256]
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
py=$(/usr/bin/python3 bench/target_forward_bench.py "$work/model" "$@")
cpp=$(build/bin/target_forward_bench "$work/model" "$@")
get() { sed -n "s/.*$2=\([0-9.]*\).*/\1/p" <<<"$1"; }
echo "target forward, Qwen3-shaped hidden 512 x 8 layers, vocab 32000, fp32, batch 4 x 256 tokens $*"
printf "%-26s %12s\n" "implementation" "tokens/s"
printf "%-26s %12s\n" "flashdraft TargetModel" "$(get "$cpp" tokens_per_s)"
printf "%-26s %12s\n" "PyTorch eager" "$(get "$py" tokens_per_s)"
