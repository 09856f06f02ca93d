#!/usr/bin/env bash
# Target forward memory and time against the sequence length: tiled (online-softmax) attention vs
# the dense [S, S] form, same binary, same run, on a target folder (default: make-tiny-target's),
# with the largest relative difference of their features and logits.
#   bench/target_memory_bench.sh [TARGET_DIR] [LENGTHS...]   e.g. bench/target_memory_bench.sh "" 2048 8192
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-}
shift || true
lengths=("$@")
[ ${#lengths[@]} -gt 0 ] || lengths=(2048 8192 16384)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "$target" ]; then
  target=$work/tiny
  build/bin/flashdraft make-tiny-target --out "$target" --steps 20 >/dev/null
fi
vocab=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" \
  "$target/config.json")
layers=$(/usr/bin/python3 -c "import json,sys; n=json.load(open(sys.argv[1]))['num_hidden_layers']; \
print(','.join(str(i) for i in sorted({0, n // 2, n - 1})))" "$target/config.json")
run() {  # S MODE -> "seconds peak_kb"
  local flag=""
  [ "$2" = dense ] && flag=--dense-attention
  /usr/bin/time -f "%e %M" -o "$work/time" build/bin/flashdraft debug target-features \
    --target "$target" --ids "$work/ids$1.safetensors" --layers "$layers" \
    --out "$work/$2$1.safetensors" $flag >/dev/null
  cat "$work/time"
}
echo "target forward memory: $(/usr/bin/python3 -c "import json,sys; c=json.load(open(sys.argv[1])); \
print(f\"hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, {c['num_attention_heads']}/\
{c['num_key_value_heads']} heads, vocab {c['vocab_size']}\")" "$target/config.json"), fp32, \
OMP_NUM_THREADS=${OMP_NUM_THREADS:-all}"
printf "%8s  %10s %12s  %10s %12s  %12s\n" tokens "tiled s" "tiled MiB" "dense s" "dense MiB" \
  "max rel diff"
for s in "${lengths[@]}"; do
  /usr/bin/python3 bench/write_ids.py "$work/ids$s.safetensors" "$s" "$vocab"
  read -r ts tk < <(run "$s" tiled)
  read -r ds dk < <(run "$s" dense)
  diff=$(/usr/bin/python3 -c "
import sys; sys.path.insert(0, 'tests/reference')
from target_reference import read_safetensors as r
a, b = r(sys.argv[1]), r(sys.argv[2])
print('%.1e' % max(((a[k] - b[k]).abs().max() / b[k].abs().max()).item() for k in a))" \
    "$work/tiled$s.safetensors" "$work/dense$s.safetensors")
  printf "%8s  %10s %12s  %10s %12s  %12s\n" "$s" "$ts" "$((tk / 1024))" "$ds" "$((dk / 1024))" \
    "$diff"
  rm -f "$work"/*"$s".safetensors
done
