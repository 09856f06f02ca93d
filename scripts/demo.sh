#!/usr/bin/env bash
# The README demo: sets up, builds and runs the largest real thing that works today.
# Today (foundation only) that is: validate the example job file, write and inspect a safetensors
# model, and measure the tensor wire codec against memcpy. The distributed training demo
# (coordinator + workers, loss falling, acceptance length rising) replaces this when it lands.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
echo
echo "== flashdraft config check deploy/examples/job.yaml"
build/cli/flashdraft config check deploy/examples/job.yaml --set train.seed=1 | head -20
echo "   ..."
echo
echo "== the tensor wire codec, 256 MiB bf16 vs memcpy"
build/bench/codec_bench --repeats 3
