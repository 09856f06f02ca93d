#!/usr/bin/env bash
# Speed and memory at a real model's shape, against PyTorch eager on the same LibTorch in the same
# run (issue 26): this machine's fp32 GEMM peak (the ceiling both sides share), the drafter
# training step at Qwen3-0.6B's drafter shape over context lengths and anchor counts, and the
# target forward (the features a job streams) at Qwen3-0.6B's layer shape.
#   bench/real_shape_bench.sh [--threads 2] [--quick]
# Each side runs in its own process; the PyTorch peer under a 20 GiB address-space limit (its dense
# attention and full logits do not fit some rows: they print "out of memory").
# FLOPs are the model's useful work (causal/anchor attention counted once, frozen weights get no
# weight gradient), the same count for both sides; "% peak" divides by the 2-core GEMM rate.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2
quick=0
while [ $# -gt 0 ]; do
  case $1 in
    --threads) threads=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
py=/usr/bin/python3
limit_kib=$((20 * 1024 * 1024))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
get() { sed -n "s/.*$2=\([0-9.]*\).*/\1/p" <<<"$1"; }
# Runs "${@:2}" (under the address-space limit when $1 = py) and prints its one result line, or
# "oom"/"failed: <its last error line>".
side() {
  local out rc=0 peer=$1
  shift
  if [ "$peer" = py ]; then
    out=$( (ulimit -v $limit_kib; $py "$@") 2>"$work/err") || rc=$?
  else
    out=$("$@" 2>"$work/err") || rc=$?
  fi
  if [ $rc -ne 0 ]; then
    if grep -qi "memory\|alloc" "$work/err"; then echo oom; else echo "failed: $(tail -1 "$work/err")"; fi
  else
    echo "$out"
  fi
}

echo "== fp32 GEMM peak (torch.matmul on this LibTorch/OpenBLAS; best of 5 per shape) =="
peak=$($py - <<'EOF'
import os, subprocess, sys, time
code = r'''
import torch, time
best = 0
for m, k, n in [(4096, 1024, 4096), (2048, 1024, 37984), (1024, 3072, 1024)]:
    a, b = torch.randn(m, k), torch.randn(k, n)
    a @ b
    for _ in range(5):
        t = time.perf_counter(); a @ b; dt = time.perf_counter() - t
        best = max(best, 2 * m * k * n / dt / 1e9)
print(f"{best:.1f}")
'''
rates = {}
for t in (1, 2):
    env = dict(os.environ, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t))
    rates[t] = float(subprocess.check_output([sys.executable, "-c", code], env=env).decode())
    print(f"{t} core(s): {rates[t]:.0f} GFLOP/s", file=sys.stderr)
print(rates[2])
EOF
)
echo "using the 2-core rate, $peak GFLOP/s, as the peak"

# Qwen3-0.6B's drafter: its layer shape, 1 layer, 5 target features, block 16, vocab 151,936.
shape=(--hidden 1024 --heads 16 --kv-heads 8 --head-dim 128 --intermediate 3072 --layers 1
  --features 5 --block 16 --vocab 151936 --batch 1 --threads "$threads")
flops() {  # S N -> GFLOP of one step
  $py - "$1" "$2" <<'EOF'
import sys
S, N = int(sys.argv[1]), int(sys.argv[2])
H, nh, kvh, hd, I, L, F, B, V = 1024, 16, 8, 128, 3072, 1, 5, 16, 151936
R, Rl = N * B, N * (B - 1)
fc = 2 * S * F * H * H
layer = 2 * R * H * nh * hd + 4 * (S + R) * H * kvh * hd + 2 * R * nh * hd * H + 6 * R * H * I
attention = 4 * nh * hd * R * (S / 2 + B)  # a block sees the context before its anchor + itself
lm = 2 * Rl * H * V
print(f"{(2 * fc + 3 * L * (layer + attention) + 2 * lm) / 1e9:.1f}")
EOF
}
echo
echo "== drafter step (fwd + bwd + clip + AdamW), Qwen3-0.6B drafter shape, batch 1 =="
printf "%6s %7s  %-14s %9s %9s %7s %9s %8s\n" S anchors implementation "step s" "GFLOP/s" \
  "% peak" "peak MiB" "C++ x"
grid=("2048 64" "2048 128" "2048 256" "2048 512" "8192 64" "8192 512")
[ $quick = 1 ] && grid=("2048 64")
for point in "${grid[@]}"; do
  read -r s n <<<"$point"
  gf=$(flops "$s" "$n")
  args=("${shape[@]}" --seq "$s" --anchors "$n" --warmup 1 --steps 3)
  cpp=$(side x build/bin/drafter_step_bench "${args[@]}")
  pyr=$(side py bench/drafter_step_bench.py "${args[@]}")
  ct=$(get "$cpp" median_step_s)
  pt=$(get "$pyr" median_step_s)
  for row in "flashdraft C++|$cpp|$ct" "PyTorch eager|$pyr|$pt"; do
    IFS='|' read -r name out t <<<"$row"
    if [ -z "$t" ]; then
      printf "%6s %7s  %-14s %9s\n" "$s" "$n" "$name" "$out"
      continue
    fi
    rate=$(awk -v g="$gf" -v t="$t" 'BEGIN{printf "%.0f", g / t}')
    pct=$(awk -v r="$rate" -v p="$peak" 'BEGIN{printf "%.0f", 100 * r / p}')
    x=""
    [ "$name" = "flashdraft C++" ] && [ -n "$pt" ] && x=$(awk -v a="$ct" -v b="$pt" 'BEGIN{printf "%.2f", b / a}')
    printf "%6s %7s  %-14s %9s %9s %7s %9s %8s\n" "$s" "$n" "$name" "$t" "$rate" "$pct" \
      "$(get "$out" peak_rss_mib)" "$x"
  done
done

echo
echo "== target forward (features of 4 layers, no logits), Qwen3-0.6B layer shape, 4 layers, batch 1 =="
tshape=(--hidden 1024 --layers 4 --heads 16 --kv-heads 8 --head-dim 128 --intermediate 3072
  --vocab 151936 --logits 0 --batch 1 --threads "$threads" --warmup 1)
printf "%6s  %-14s %9s %9s %9s %7s %9s %8s\n" S implementation "s" "tokens/s" "GFLOP/s" "% peak" \
  "peak MiB" "C++ x"
lengths=(2048 8192)
[ $quick = 1 ] && lengths=(2048)
for s in "${lengths[@]}"; do
  # 4 layers of projections and MLP, causal attention (half the S x S scores), per token.
  gf=$(awk -v S="$s" 'BEGIN{H=1024; q=2048; kv=1024; I=3072;
    layer = 2*H*q + 2*2*H*kv + 2*q*H + 6*H*I; att = 4*q*S/2;
    printf "%.1f", 4 * S * (layer + att) / 1e9}')
  repeats=3
  [ "$s" -gt 4096 ] && repeats=2
  pyr=$(side py bench/target_forward_bench.py "$work/target" "${tshape[@]}" --seq "$s" \
    --repeats $repeats)
  [ -f "$work/target/config.json" ] || { echo "the peer did not write the target: $pyr"; exit 1; }
  cpp=$(side x build/bin/target_forward_bench "$work/target" --logits 0 --batch 1 \
    --threads "$threads" --warmup 1 --seq "$s" --repeats $repeats)
  ct=$(get "$cpp" best_s)
  pt=$(get "$pyr" best_s)
  for row in "flashdraft C++|$cpp|$ct" "PyTorch eager|$pyr|$pt"; do
    IFS='|' read -r name out t <<<"$row"
    if [ -z "$t" ]; then
      printf "%6s  %-14s %9s\n" "$s" "$name" "$out"
      continue
    fi
    rate=$(awk -v g="$gf" -v t="$t" 'BEGIN{printf "%.0f", g / t}')
    pct=$(awk -v r="$rate" -v p="$peak" 'BEGIN{printf "%.0f", 100 * r / p}')
    x=""
    [ "$name" = "flashdraft C++" ] && [ -n "$pt" ] && x=$(awk -v a="$ct" -v b="$pt" 'BEGIN{printf "%.2f", b / a}')
    printf "%6s  %-14s %9s %9s %9s %7s %9s %8s\n" "$s" "$name" "$t" "$(get "$out" tokens_per_s)" \
      "$rate" "$pct" "$(get "$out" peak_rss_mib)" "$x"
  done
done
