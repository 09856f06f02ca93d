#!/usr/bin/env bash
# Target feeders scale capture: the demo job (tiny target, regeneration off) with 1, 2 and 4
# flashdraft-feeder processes, each slowed by FLASHDRAFT_FAULT=slow-feeder:ms=MS to MS ms per sample
# (standing in for a device's capture time), 2 workers and a prefetch window wide enough that the
# workers are not the bottleneck. Steps/s from steps.jsonl (first 5 steps excluded) against the run
# with one feeder (targets: >= 1.8x with 2, >= 3.2x with 4), and the in-process target (no feeders,
# no slowdown) as the floor of what the workers themselves take.
#   bench/feeders_bench.sh [steps=40] [ms_per_sample=250]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-40}
ms=${2:-250}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build/bin/flashdraft make-tiny-target --out "$work/target" --steps 150 --merges 256 --hidden 64 \
  --layers 4 >/dev/null
run() {  # name feeders fault
  FLASHDRAFT_FAULT=$3 build/bin/flashdraft launch deploy/examples/demo.yaml --workers 2 \
    --feeders "$2" --out "$work/$1" --max-restarts 0 \
    --set "target.path=$work/target" --set "data.jsonl=$work/target/chats.jsonl" \
    --set data.regenerate=false --set data.prefetch_steps=8 --set "train.max_steps=$steps" \
    --set checkpoint.every_steps=0 >"$work/$1.log" 2>&1 || { cat "$work/$1.log"; exit 1; }
}
run f0 0 ""
for n in 1 2 4; do run "f$n" "$n" "slow-feeder:ms=$ms"; done
/usr/bin/python3 - "$work" "$steps" "$ms" <<'PY'
import json, sys
work, steps, ms = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def rate(name):
    recs = [r for r in map(json.loads, open(f"{work}/{name}/steps.jsonl")) if "step" in r][5:]
    return len(recs) / sum(r["step_seconds"] for r in recs), recs[-1]["loss"]
base, _ = rate("f1")
print(f"target feeders, demo job (tiny target), 2 workers, batch 8 (2 shards of 4 samples per "
      f"step), prefetch 8 steps, {steps} steps (first 5 excluded), each feeder slowed to {ms} ms "
      "per sample, 2 cores")
print(f"{'feature source':<36} {'steps/s':>8} {'vs 1 feeder':>12} {'ideal':>6} {'final loss':>11}")
for name, label, ideal in (("f0", "in-process target, not slowed", ""), ("f1", "1 feeder", "1.00x"),
                           ("f2", "2 feeders", "2.00x"), ("f4", "4 feeders", "4.00x")):
    r, loss = rate(name)
    print(f"{label:<36} {r:>8.3f} {r / base:>11.2f}x {ideal:>6} {loss:>11.4f}")
PY
