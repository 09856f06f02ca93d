#!/usr/bin/env bash
# Online hidden states: the features/s the target source delivers (target_source_bench) against
# what one worker consumes training the demo's drafter on the same data (a 1-worker run on shards
# prepared from it, so that the worker does not share the cores with the source), in the same run.
#   bench/target_source_bench.sh [steps=60]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-60}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build/bin/flashdraft make-tiny-target --out runs/tiny-target >/dev/null
build/bin/target_source_bench --target runs/tiny-target --data runs/tiny-target/chats.jsonl \
  --layers 1,3 --samples 64
build/bin/flashdraft prepare --target runs/tiny-target --data runs/tiny-target/chats.jsonl \
  --layers 1,3 --out "$work/shards" >/dev/null
cat > "$work/job.yaml" <<YAML
output_dir: $work/run
drafter: {num_hidden_layers: 1, block_size: 8, num_target_features: 2, max_anchors: 16}
data: {source: shards, shards_dir: $work/shards, max_seq_len: 256}
train: {seed: 0, learning_rate: 0.003, max_steps: $steps, global_batch_size: 8}
YAML
build/bin/flashdraft launch "$work/job.yaml" --workers 1 >/dev/null
/usr/bin/python3 - "$work" <<'PY'
import json, sys
recs = [r for r in map(json.loads, open(f"{sys.argv[1]}/run/steps.jsonl")) if "step" in r][5:]
tok = sum(r["tokens"] for r in recs) / sum(r["step_seconds"] for r in recs)
print(f"{'one worker consumes (demo drafter, 1 thread)':<44} {tok:>12.0f}")
PY
