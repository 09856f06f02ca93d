#!/usr/bin/env bash
# The README demo: sets up, builds, creates the tiny Qwen3-shaped target (a byte-level BPE tokenizer
# and a 4-layer model trained on Debian's license texts; ~2.5 min the first time, then cached) and
# trains a DFlash drafter for it online: the coordinator answers the demo chats with the target's
# own greedy replies, runs the target to get its hidden states and streams them over gRPC to 2
# worker processes that all-reduce over Gloo. The loss falls, the acceptance-length estimate τ
# rises. Output: runs/demo/steps.jsonl, runs/demo/logs/ and the exported drafter in runs/demo/drafter.
# Then `flashdraft eval` runs that drafter the way a server does, on held-out prompts and on training
# chats: the real acceptance length τ, the acceptance per block position, the speedup over the
# target alone on this machine, and the lossless check (the output equals the target's own).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Only what the demo runs (the tests and benchmarks are scripts/test.sh's).
FLASHDRAFT_TARGETS="flashdraft flashdraft-coordinator flashdraft-worker" scripts/build.sh
echo
echo "== flashdraft make-tiny-target --out runs/tiny-target"
build/bin/flashdraft make-tiny-target --out runs/tiny-target
echo
echo "== deploy/make-certs.sh runs/demo-pki   (a throwaway CA, certificates and job secret)"
deploy/make-certs.sh runs/demo-pki
pki=runs/demo-pki
echo
echo "== flashdraft launch deploy/examples/demo.yaml --workers 2   (mutual TLS + job secret)"
rm -rf runs/demo  # a fresh run each time (an earlier run's checkpoints would be refused)
build/bin/flashdraft launch deploy/examples/demo.yaml --workers 2 \
  --set security.tls_cert=$pki/coordinator.pem --set security.tls_key=$pki/coordinator.key \
  --set security.tls_ca=$pki/ca.pem --set security.client_cert=$pki/worker.pem \
  --set security.client_key=$pki/worker.key --set security.token_file=$pki/token
echo
echo "== flashdraft eval: the trained drafter as a server runs it (greedy speculative decoding)"
echo "   on 64 held-out prompts it never trained on:"
build/bin/flashdraft eval --target runs/tiny-target --drafter runs/demo/drafter \
  --prompts runs/tiny-target/heldout-chats.jsonl --max-new-tokens 64 --json-out runs/demo/eval.json
echo
echo "   and on 64 of the chats it trained on:"
build/bin/flashdraft eval --target runs/tiny-target --drafter runs/demo/drafter \
  --prompts runs/tiny-target/chats.jsonl --limit 64 --max-new-tokens 64
echo
echo "== flashdraft report: the job on one page"
build/bin/flashdraft report --job runs/demo --eval runs/demo/eval.json --out runs/demo/report.html
echo "   open runs/demo/report.html in a browser"
