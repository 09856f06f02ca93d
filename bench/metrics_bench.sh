#!/usr/bin/env bash
# Metrics overhead (issue: < 1% of step time): the same 2-worker job with metrics on — the
# coordinator and both workers serving /metrics, every target of the job's targets.json scraped
# every second as Prometheus would — and off (metrics.enabled: false), alternated so that the
# machine's drift hits both; mean step time from steps.jsonl (first 10 steps excluded). Then
# build/bin/metrics_bench's per-step recording and per-scrape costs set against that step time.
#   bench/metrics_bench.sh [steps=400] [rounds=3]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-400}
rounds=${2:-3}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
build/bin/flashdraft make-shards --out "$work/shards" --samples 256 --seq 128 --hidden 128 >/dev/null
cat > "$work/job.yaml" <<YAML
drafter: {num_hidden_layers: 1, block_size: 16, num_target_features: 2, max_anchors: 16}
data: {source: shards, shards_dir: $work/shards, max_seq_len: 128}
train: {seed: 0, max_steps: $steps, global_batch_size: 8}
YAML
scrape() {  # every target in $1 once a second (until killed)
  while [ ! -f "$1" ]; do sleep 0.1; done
  while true; do
    for t in $(/usr/bin/python3 -c 'import json,sys; print(" ".join(a for g in json.load(open(sys.argv[1])) for a in g["targets"]))' "$1" 2>/dev/null); do
      curl -s -o /dev/null "http://$t/metrics" || true
    done
    sleep 1
  done
}
for round in $(seq "$rounds"); do
  for mode in on off; do
    out="$work/$mode-$round"
    enabled=$([ $mode = on ] && echo true || echo false)
    scraper=
    if [ $mode = on ]; then
      scrape "$out/prometheus/targets.json" &
      scraper=$!
    fi
    build/bin/flashdraft launch "$work/job.yaml" --workers 2 --out "$out" \
      --set metrics.enabled=$enabled >/dev/null 2>&1
    [ -z "$scraper" ] || { kill $scraper; wait $scraper 2>/dev/null || true; }
  done
done
micro=$(build/bin/metrics_bench --iterations 100000 --block-size 16)
/usr/bin/python3 - "$work" "$rounds" "$steps" "$micro" <<'PY'
import json, re, sys
work, rounds, steps, micro = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def mean_step(name):
    recs = [r for r in map(json.loads, open(f"{work}/{name}/steps.jsonl")) if "step" in r][10:]
    return sum(r["step_seconds"] for r in recs) / len(recs)
print(f"2 workers, drafter hidden 128, 1 layer, B 16, batch 8 x <=128 tokens, {steps} steps, "
      f"{rounds} rounds alternated; 2 cores")
print(f"{'round':<8} {'metrics on: step ms':>20} {'off: step ms':>14} {'on/off':>8}")
on_all, off_all = [], []
for r in range(1, rounds + 1):
    on, off = mean_step(f"on-{r}"), mean_step(f"off-{r}")
    on_all.append(on); off_all.append(off)
    print(f"{r:<8} {1e3 * on:>20.3f} {1e3 * off:>14.3f} {on / off:>8.3f}")
on, off = sum(on_all) / rounds, sum(off_all) / rounds
print(f"{'mean':<8} {1e3 * on:>20.3f} {1e3 * off:>14.3f} {on / off:>8.3f}")
print()
print(micro)
ns = {k: float(v) for k, v in re.findall(r"(coordinator: a committed|worker: a step)\S*[^\n]*?([0-9.]+) ns", micro)}
us = [float(v) for v in re.findall(r"scrape's serialization\s+([0-9.]+) us", micro)]
per_step = sum(ns.values()) * 1e-9
per_second = sum(us) * 1e-6  # one scrape of each per second (coordinator + one worker)
print(f"recording: {1e6 * per_step:.2f} us per step = {100 * per_step / off:.4f}% of a {1e3 * off:.1f} ms step; "
      f"scrapes at 1/s: {100 * per_second:.3f}% of one core")
PY
