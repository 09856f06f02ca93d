#!/usr/bin/env bash
# Distributed training throughput on this machine: the same job with 1 and with 2 worker processes
# (coordinator + workers via `flashdraft launch`), read back from steps.jsonl: steps/s, tokens/s,
# the share of each step the slowest worker waited for data, and the all-reduce time backward did
# not hide — with 2 workers once with one gradient bucket (reduced after backward, the peer) and once
# with 256 KiB buckets that start while backward runs. All with the plain all-reduce
# (train.deterministic_reduction: false); bench/reduction_bench.sh compares it with the ordered one.
#   bench/workers_bench.sh [steps=60] [hidden=128] [layers=2]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-60}
hidden=${2:-128}
layers=${3:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build/bin/flashdraft make-shards --out "$work/shards" --samples 512 --seq 256 --hidden "$hidden" >/dev/null
run() {  # name workers bucket_mib
  cat > "$work/$1.yaml" <<YAML
output_dir: $work/run
drafter: {num_hidden_layers: $layers, block_size: 16, num_target_features: 2, max_anchors: 32}
data: {source: shards, shards_dir: $work/shards, max_seq_len: 256}
train: {seed: 0, learning_rate: 0.003, max_steps: $steps, global_batch_size: 8,
        deterministic_reduction: false}
cluster: {heartbeat_interval_seconds: 1, heartbeat_timeout_seconds: 60, allreduce_bucket_mib: $3}
YAML
  build/bin/flashdraft launch "$work/$1.yaml" --workers "$2" --out "$work/$1" >/dev/null
}
run w1 1 4
run w2-one-bucket 2 4096
run w2-buckets 2 0.25
/usr/bin/python3 - "$work" "$steps" "$hidden" "$layers" <<'PY'
import json, sys
work, steps, hidden, layers = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"distributed training, hidden {hidden}, {layers} layers, B 16, batch 8 x <=256 tokens, {steps} steps "
      "(first 5 excluded), 1 intra-op thread per worker, 2 cores")
print(f"{'workers, gradient buckets':<34} {'step s':>8} {'steps/s':>8} {'tokens/s':>9} "
      f"{'wait % of step':>15} {'allreduce s':>12} {'final loss':>10}")
for name, label in (("w1", "1"), ("w2-one-bucket", "2, one bucket after backward"),
                    ("w2-buckets", "2, 256 KiB buckets during backward")):
    recs = [r for r in map(json.loads, open(f"{work}/{name}/steps.jsonl")) if "step" in r][5:]
    t = sum(r["step_seconds"] for r in recs) / len(recs)
    tok = sum(r["tokens"] for r in recs) / sum(r["step_seconds"] for r in recs)
    wait = 100 * sum(r["timings"]["max_wait"] for r in recs) / sum(r["step_seconds"] for r in recs)
    ar = sum(r["timings"]["allreduce"] for r in recs) / len(recs)
    print(f"{label:<34} {t:>8.3f} {1 / t:>8.2f} {tok:>9.0f} {wait:>15.2f} {ar:>12.4f} "
          f"{recs[-1]['loss']:>10.4f}")
PY
