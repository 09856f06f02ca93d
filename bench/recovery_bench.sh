#!/usr/bin/env bash
# Recovery after `kill -9` of 1 of 3 workers (`flashdraft launch`, default cluster settings): from
# the kill to the new epoch (detection) and to the commit of the step that was in flight
# (recovery); the peer is the ordinary step time of the same run. Median of 5 runs. The scenario
# and what is measured: bench/recovery_bench.py.
#   bench/recovery_bench.sh [runs=5]
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 bench/recovery_bench.py kill "${1:-5}"
