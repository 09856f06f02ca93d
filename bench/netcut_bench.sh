#!/usr/bin/env bash
# Recovery after the network of 1 of 3 workers is cut (it runs in its own network namespace; the
# link goes down after step 20): it is declared lost after cluster.heartbeat_timeout_seconds (the
# default, 20 s), then the group re-forms and the step in flight commits. Needs root (ip netns).
# Median of 5 runs. The scenario and what is measured: bench/recovery_bench.py.
#   bench/netcut_bench.sh [runs=5]
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 bench/recovery_bench.py cut "${1:-5}"
