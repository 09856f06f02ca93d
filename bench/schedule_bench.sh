#!/usr/bin/env bash
# Learning-rate schedules and the best checkpoint on the demo (issue: training recipes): the demo
# job (tiny target, 2 workers, drafter trained online) once per train.lr_schedule, then `flashdraft
# eval` of each exported drafter on the 64 held-out prompts, every τ count it reports. The peer is
# the cosine run (the default, every earlier job's schedule) of the same invocation. The wsd run
# also evaluates during training every `eval_every` steps on the first 16 held-out prompts with
# checkpoint.keep_best, and drafter-best is evaluated beside its final drafter.
#   bench/schedule_bench.sh [steps=600] [max_new_tokens=64] [eval_every=100]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-600}
new=${2:-64}
every=${3:-100}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
target="$work/target"
build/bin/flashdraft make-tiny-target --out "$target" >/dev/null
train() {  # name schedule [extra --set ...]
  local name=$1 schedule=$2
  shift 2
  build/bin/flashdraft launch deploy/examples/demo.yaml --workers 2 --out "$work/$name" \
    --set target.path="$target" --set data.jsonl="$target/chats.jsonl" \
    --set train.max_steps="$steps" --set train.lr_schedule="$schedule" "$@" >"$work/$name.out" 2>&1 ||
    { tail -20 "$work/$name.out"; exit 1; }
}
evaluate() {  # drafter_dir json_out
  build/bin/flashdraft eval --target "$target" --drafter "$1" \
    --prompts "$target/heldout-chats.jsonl" --max-new-tokens "$new" --threads 1 \
    --json-out "$2" >"$2.out" 2>&1 || { tail -20 "$2.out"; exit 1; }
}
for schedule in cosine linear constant; do
  train "$schedule" "$schedule"
  evaluate "$work/$schedule/drafter" "$work/$schedule.json"
done
train wsd wsd --set train.decay_ratio=0.2 --set eval.every_steps="$every" \
  --set eval.prompts="$target/heldout-chats.jsonl" --set eval.limit=16 \
  --set eval.max_new_tokens="$new" --set checkpoint.keep_best=true
evaluate "$work/wsd/drafter" "$work/wsd.json"
evaluate "$work/wsd/drafter-best" "$work/wsd-best.json"
/usr/bin/python3 - "$work" "$steps" "$new" <<'PY'
import json, sys
work, steps, new = sys.argv[1:4]
def final_loss(name):
    rows = [json.loads(l) for l in open(f"{work}/{name}/steps.jsonl")]
    losses = [r["loss"] for r in rows if "loss" in r and "event" not in r]
    tail = losses[-20:]
    return sum(tail) / len(tail)
best = json.load(open(f"{work}/wsd/checkpoints/best.json"))
print(f"demo job, {steps} steps, 2 workers; flashdraft eval on 64 held-out prompts x {new} new "
      f"tokens, block 8, 1 intra-op thread")
print(f"{'run':<34} {'loss (last 20)':>14} {'tau':>6} {'z-lab':>6} {'pooled':>7} {'sglang':>7}")
rows = [("cosine (default, the peer)", "cosine", "cosine"), ("linear", "linear", "linear"),
        ("constant", "constant", "constant"), ("wsd, decay 0.2", "wsd", "wsd"),
        (f"wsd drafter-best (step {best['completed_steps']})", "wsd", "wsd-best")]
for label, run, result in rows:
    e = json.load(open(f"{work}/{result}.json"))
    print(f"{label:<34} {final_loss(run):>14.4f} {e['tau']:>6.2f} {e['tau_zlab']:>6.2f} "
          f"{e['tau_pooled']:>7.2f} {e['tau_sglang']:>7.2f}")
PY
