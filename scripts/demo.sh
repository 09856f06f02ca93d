#!/usr/bin/env bash
# The README demo: sets up, builds and runs the largest real thing that works today.
# Today that is one process training a DFlash drafter (the full model: KV injection, block
# attention, decayed loss, AdamW + cosine schedule) on a synthetic learnable language: loss falls,
# per-slot accuracy and the acceptance-length estimate τ rise. The distributed demo (coordinator +
# workers over gRPC and Gloo) replaces it when that work lands.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
echo
echo "== flashdraft config check deploy/examples/job.yaml (the job file format, validated)"
build/cli/flashdraft config check deploy/examples/job.yaml >/dev/null && echo "valid"
echo
echo "== flashdraft debug train-synthetic --out runs/demo   (one process, 2 threads)"
build/cli/flashdraft debug train-synthetic --out runs/demo
echo
echo "per-step record: runs/demo/steps.jsonl ($(wc -l < runs/demo/steps.jsonl) steps)"
