#!/usr/bin/env bash
# Distributed training throughput on this machine: the same job with 1 and with 2 worker processes
# (coordinator + workers via `flashdraft launch`), read back from steps.jsonl: steps/s, tokens/s, and
# the share of each step the slowest worker waited for data.
#   bench/workers_bench.sh [steps=60]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-60}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build/bin/flashdraft make-shards --out "$work/shards" --samples 512 --seq 256 --hidden 128 >/dev/null
cat > "$work/job.yaml" <<YAML
output_dir: $work/run
drafter: {num_hidden_layers: 2, block_size: 16, num_target_features: 2, max_anchors: 32}
data: {source: shards, shards_dir: $work/shards, max_seq_len: 256}
train: {seed: 0, learning_rate: 0.003, max_steps: $steps, global_batch_size: 8}
cluster: {heartbeat_interval_seconds: 1, heartbeat_timeout_seconds: 60}
YAML
for w in 1 2; do
  build/bin/flashdraft launch "$work/job.yaml" --workers "$w" --out "$work/run$w" >/dev/null
done
/usr/bin/python3 - "$work" "$steps" <<'PY'
import json, sys
work, steps = sys.argv[1], int(sys.argv[2])
print(f"distributed training, hidden 128, 2 layers, B 16, batch 8 x <=256 tokens, {steps} steps "
      "(first 5 excluded), 1 intra-op thread per worker, 2 cores")
print(f"{'workers':>8} {'step s':>8} {'steps/s':>8} {'tokens/s':>9} {'wait % of step':>15} "
      f"{'allreduce s':>12} {'final loss':>10}")
for w in (1, 2):
    recs = [json.loads(l) for l in open(f"{work}/run{w}/steps.jsonl")][5:]
    t = sum(r["step_seconds"] for r in recs) / len(recs)
    tok = sum(r["tokens"] for r in recs) / sum(r["step_seconds"] for r in recs)
    wait = 100 * sum(r["timings"]["max_wait"] for r in recs) / sum(r["step_seconds"] for r in recs)
    ar = sum(r["timings"]["allreduce"] for r in recs) / len(recs)
    print(f"{w:>8} {t:>8.3f} {1 / t:>8.2f} {tok:>9.0f} {wait:>15.2f} {ar:>12.4f} {recs[-1]['loss']:>10.4f}")
PY
