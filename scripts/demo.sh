#!/usr/bin/env bash
# The README demo: sets up, builds, writes a small synthetic-but-learnable data set (offline shards
# of a synthetic target's hidden states) and trains a DFlash drafter on it with a coordinator and 2
# worker processes (gRPC streaming, Gloo all-reduce): the loss falls, the acceptance-length estimate
# τ rises. Output: runs/demo/steps.jsonl and runs/demo/logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
if [ ! -f runs/demo-data/manifest.json ]; then
  build/bin/flashdraft make-shards --out runs/demo-data
fi
echo
echo "== flashdraft launch deploy/examples/demo.yaml --workers 2"
build/bin/flashdraft launch deploy/examples/demo.yaml --workers 2
