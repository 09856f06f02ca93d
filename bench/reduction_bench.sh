#!/usr/bin/env bash
# The deterministic gradient reduction (train.deterministic_reduction: virtual shards summed by a
# fixed tree; all-to-all + all-gather) against its peer, the plain bucketed Gloo all-reduce, on the
# same job with 2 worker processes (coordinator + workers via `flashdraft launch`), read back from
# steps.jsonl: step time, the exchange time backward did not hide, gradient bytes each step (as the
# workers count them), and bytes over loopback per step measured from /proc/net/dev (everything:
# hidden-state stream + gradients + control). Rows:
#   plain             deterministic_reduction: false (one shard per worker, ring all-reduce)
#   ordered, K=2      the tree over 2 shards: same batches as plain, only the reduction differs
#   ordered, K=8      the default: 8 shards of 1 sample, 4 per worker (batching differs too)
#   1 worker, K=8     the same numbers as the 2-worker K=8 row, bit for bit (checked)
#   bench/reduction_bench.sh [steps=60] [hidden=128] [layers=2]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-60}
hidden=${2:-128}
layers=${3:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build/bin/flashdraft make-shards --out "$work/shards" --samples 512 --seq 256 --hidden "$hidden" >/dev/null
lo_bytes() { awk '$1 == "lo:" {print $2}' /proc/net/dev; }
run() {  # name workers deterministic virtual_shards
  cat > "$work/$1.yaml" <<YAML
output_dir: $work/run
drafter: {num_hidden_layers: $layers, block_size: 16, num_target_features: 2, max_anchors: 32}
data: {source: shards, shards_dir: $work/shards, max_seq_len: 256}
train: {seed: 0, learning_rate: 0.003, max_steps: $steps, global_batch_size: 8,
        deterministic_reduction: $3, virtual_shards: $4}
cluster: {heartbeat_interval_seconds: 1, heartbeat_timeout_seconds: 60, allreduce_bucket_mib: 0.25}
checkpoint: {every_steps: 0}
metrics: {enabled: false}
YAML
  local before after
  before=$(lo_bytes)
  build/bin/flashdraft launch "$work/$1.yaml" --workers "$2" --out "$work/$1" >/dev/null
  after=$(lo_bytes)
  echo $((after - before)) > "$work/$1/lo_bytes"
}
run plain 2 false 0
run k2 2 true 2
run k8 2 true 8
run k8w1 1 true 8
/usr/bin/python3 - "$work" "$steps" "$hidden" "$layers" <<'PY'
import json, sys
work, steps, hidden, layers = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"gradient reduction, hidden {hidden}, {layers} layers, B 16, batch 8 x <=256 tokens, {steps} steps "
      "(first 5 excluded from times), 256 KiB buckets, 1 intra-op thread per worker, 2 cores")
print(f"{'reduction':<26} {'step s':>7} {'exchange s':>10} {'grad MB/step':>12} "
      f"{'loopback MB/step':>16} {'final loss':>12}")
rows = {}
for name, label in (("plain", "plain all-reduce, 2 w"), ("k2", "ordered K=2, 2 w"),
                    ("k8", "ordered K=8, 2 w"), ("k8w1", "ordered K=8, 1 w")):
    all_recs = [r for r in map(json.loads, open(f"{work}/{name}/steps.jsonl")) if "step" in r]
    rows[name] = all_recs
    recs = all_recs[5:]
    t = sum(r["step_seconds"] for r in recs) / len(recs)
    ex = sum(r["timings"]["allreduce"] for r in recs) / len(recs)
    grad = sum(r["collective_bytes"] for r in all_recs) / len(all_recs) / 1e6
    lo = int(open(f"{work}/{name}/lo_bytes").read()) / len(all_recs) / 1e6
    print(f"{label:<26} {t:>7.3f} {ex:>10.4f} {grad:>12.3f} {lo:>16.3f} {all_recs[-1]['loss']:>12.8f}")
keys = ("loss", "slot_accuracy", "weight_sum", "tokens")
same = all(json.dumps([a[k] for k in keys]) == json.dumps([b[k] for k in keys])
           for a, b in zip(rows["k8"], rows["k8w1"]))
print(f"ordered K=8: 1 and 2 workers bitwise equal on every step: {same}")
PY
