#!/usr/bin/env bash
# Distillation against cross-entropy on the demo (issue: training recipes): the demo job (tiny
# target, 2 workers, drafter trained online) once per train.loss — ce (the default, the peer), kl,
# and mix with ce_weight 0.5 — then `flashdraft eval` of each exported drafter on the 64 held-out
# prompts, every τ count it reports, and each run's wall time (kl and mix carry the target's final
# hidden state too and form the target's logits at every drafted position).
#   bench/loss_bench.sh [steps=600] [max_new_tokens=64]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-600}
new=${2:-64}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
target="$work/target"
build/bin/flashdraft make-tiny-target --out "$target" >/dev/null
for run in "ce" "kl" "mix --set train.ce_weight=0.5"; do
  set -- $run
  name=$1
  shift
  start=$(date +%s.%N)
  build/bin/flashdraft launch deploy/examples/demo.yaml --workers 2 --out "$work/$name" \
    --set target.path="$target" --set data.jsonl="$target/chats.jsonl" \
    --set train.max_steps="$steps" --set train.loss="$name" "$@" >"$work/$name.out" 2>&1 ||
    { tail -20 "$work/$name.out"; exit 1; }
  awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }' >"$work/$name.seconds"
  build/bin/flashdraft eval --target "$target" --drafter "$work/$name/drafter" \
    --prompts "$target/heldout-chats.jsonl" --max-new-tokens "$new" --threads 1 \
    --json-out "$work/$name.json" >"$work/$name.eval" 2>&1 || { tail -20 "$work/$name.eval"; exit 1; }
done
/usr/bin/python3 - "$work" "$steps" "$new" <<'PY'
import json, sys
work, steps, new = sys.argv[1:4]
def tail_mean(name, key):
    rows = [json.loads(l) for l in open(f"{work}/{name}/steps.jsonl")]
    values = [r[key] for r in rows if "loss" in r and "event" not in r and key in r]
    values = values[-20:]
    return sum(values) / len(values) if values else float("nan")
print(f"demo job, {steps} steps, 2 workers; flashdraft eval on 64 held-out prompts x {new} new "
      f"tokens, block 8, 1 intra-op thread")
print(f"{'train.loss':<26} {'CE (last 20)':>12} {'KL (last 20)':>12} {'train s':>8} {'tau':>6} "
      f"{'z-lab':>6} {'pooled':>7} {'sglang':>7} {'lossless':>9}")
for label, name in (("ce (default, the peer)", "ce"), ("kl", "kl"), ("mix, ce_weight 0.5", "mix")):
    e = json.load(open(f"{work}/{name}.json"))
    seconds = float(open(f"{work}/{name}.seconds").read())
    print(f"{label:<26} {tail_mean(name, 'loss'):>12.4f} {tail_mean(name, 'kl'):>12.4f} "
          f"{seconds:>8.1f} {e['tau']:>6.2f} {e['tau_zlab']:>6.2f} {e['tau_pooled']:>7.2f} "
          f"{e['tau_sglang']:>7.2f} {str(e['lossless']):>9}")
PY
