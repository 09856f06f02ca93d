#!/usr/bin/env bash
# Speculative decoding on this machine (issue: eval throughput): for the demo's tiny target and for
# a larger CPU-sized one, a drafter trained online as the demo trains it, then `flashdraft eval`
# on the held-out prompts: target-only vs speculative tokens/s (the peer is the target alone,
# decoding the same prompts in the same run), τ and the lossless check. One intra-op thread.
# The larger target is trained by make-tiny-target too: hidden 384 with 8 layers took over 8 min on
# a 2-core VM before the drafter even started, so the default is smaller.
#   bench/eval_bench.sh [drafter_steps=600] [max_new_tokens=64] [larger_hidden=256] [larger_layers=6]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-600}
new=${2:-64}
larger_hidden=${3:-256}
larger_layers=${4:-6}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() {  # name hidden layers target_steps
  local target="$work/$1-target"
  build/bin/flashdraft make-tiny-target --out "$target" --hidden "$2" --layers "$3" \
    --steps "$4" >/dev/null
  build/bin/flashdraft launch deploy/examples/demo.yaml --workers 2 --out "$work/$1" \
    --set target.path="$target" --set data.jsonl="$target/chats.jsonl" \
    --set train.max_steps="$steps" --set checkpoint.every_steps=0 >/dev/null 2>&1
  build/bin/flashdraft eval --target "$target" --drafter "$work/$1/drafter" \
    --prompts "$target/heldout-chats.jsonl" --max-new-tokens "$new" --threads 1 \
    --json-out "$work/$1.json" >/dev/null 2>&1
}
run tiny 128 4 300
run larger "$larger_hidden" "$larger_layers" 150
/usr/bin/python3 - "$work" "$steps" "$new" "$larger_hidden" "$larger_layers" <<'PY'
import json, sys
work, steps, new, lh, ll = sys.argv[1:6]
print(f"greedy speculative decoding, 64 held-out prompts x {new} new tokens, block 8, drafter: 1 layer "
      f"trained {steps} steps online; 1 intra-op thread")
print(f"{'target':<28} {'tau':>5} {'target tok/s':>13} {'spec tok/s':>11} {'speedup':>8} {'lossless':>9}")
for name, label in (("tiny", "hidden 128, 4 layers"), ("larger", f"hidden {lh}, {ll} layers")):
    e = json.load(open(f"{work}/{name}.json"))
    print(f"{label:<28} {e['tau']:>5.2f} {e['target_only']['tokens_per_second']:>13.1f} "
          f"{e['speculative']['tokens_per_second']:>11.1f} {e['speedup']:>7.2f}x {str(e['lossless']):>9}")
PY
