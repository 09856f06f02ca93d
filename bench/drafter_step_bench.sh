#!/usr/bin/env bash
# Drafter training step: flashdraft (C++) vs PyTorch eager on the same LibTorch, same config and
# threads, in one run. Usage: bench/drafter_step_bench.sh [flags passed to both, e.g. --threads 2]
set -euo pipefail
cd "$(dirname "$0")/.."
flags=("$@")
cpp=$(build/bin/drafter_step_bench "${flags[@]}")
py=$(/usr/bin/python3 bench/drafter_step_bench.py "${flags[@]}")
get() { sed -n "s/.*$2=\([0-9.]*\).*/\1/p" <<<"$1"; }
echo "drafter step (fwd+bwd+AdamW), hidden 256, 2 layers, B 16, S 512, 64 anchors, batch 2, vocab 8192 ${flags[*]}"
printf "%-28s %14s %14s %14s\n" "implementation" "median step s" "best step s" "peak RSS MiB"
printf "%-28s %14s %14s %14s\n" "flashdraft C++ (chunked)" "$(get "$cpp" median_step_s)" "$(get "$cpp" min_step_s)" "$(get "$cpp" peak_rss_mib)"
printf "%-28s %14s %14s %14s\n" "PyTorch eager (dense mask)" "$(get "$py" median_step_s)" "$(get "$py" min_step_s)" "$(get "$py" peak_rss_mib)"
