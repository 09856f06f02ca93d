#!/usr/bin/env bash
# Recovery after `kill -9` of a worker (elastic membership): a job with 3 worker processes
# (`flashdraft launch`, default cluster settings but the heartbeat), one worker killed with SIGKILL
# after step 20; from the kill to the new epoch (detection: the coordinator sees the stream break
# and sends Reform), and from the kill to the commit of the step that was in flight (detection +
# re-forming the Gloo group + the state checksum + re-sending and computing the step). The peer is
# the ordinary step time of the same run. Median of 5 runs.
#   bench/recovery_bench.sh [runs=5]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
work=$(mktemp -d)
trap 'pkill -9 -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
build/bin/flashdraft make-shards --out "$work/shards" --samples 256 --seq 128 --hidden 64 >/dev/null
cat > "$work/job.yaml" <<YAML
output_dir: $work/run
drafter: {num_hidden_layers: 2, block_size: 8, num_target_features: 2, max_anchors: 16}
data: {source: shards, shards_dir: $work/shards, max_seq_len: 128}
train: {seed: 0, learning_rate: 0.003, max_steps: 80, global_batch_size: 8}
checkpoint: {every_steps: 0}
metrics: {enabled: false}
YAML
/usr/bin/python3 - "$work" "$runs" <<'PY'
import json, os, signal, statistics, subprocess, sys, time
work, runs = sys.argv[1], int(sys.argv[2])
detect, recover, step = [], [], []
for run in range(runs):
    out = f"{work}/r{run}"
    log = open(f"{out}.log", "w")
    p = subprocess.Popen(["build/bin/flashdraft", "launch", f"{work}/job.yaml", "--workers", "3",
                          "--out", out], stdout=log, stderr=subprocess.STDOUT)
    def records():
        try:
            return [json.loads(l) for l in open(f"{out}/steps.jsonl") if l.strip()]
        except (FileNotFoundError, json.JSONDecodeError):
            return []
    while sum("step" in r for r in records()) < 20:
        time.sleep(0.005)
    port = open(f"{out}/coordinator.port").read().strip()
    pid = int(subprocess.check_output(
        ["pgrep", "-f", f"flashdraft-worker --coordinator 127.0.0.1:{port} --id worker-1"]).split()[0])
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    p.wait()
    recs = records()
    events = [r for r in recs if r.get("event") == "membership"]
    steps = [r for r in recs if "step" in r]
    after = [r for r in steps if r["unix_time"] > killed_at]
    detect.append(events[-1]["unix_time"] - killed_at)
    recover.append(after[0]["unix_time"] - killed_at)
    step.append(statistics.median(r["step_seconds"] for r in steps[5:]))
    assert len(steps) == 80 and steps[-1]["world_size"] == 2, "the job did not finish with 2"
print(f"recovery after kill -9 of 1 of 3 workers, {runs} runs (median [min..max]), 2 cores")
fmt = lambda xs: f"{statistics.median(xs):.3f} [{min(xs):.3f}..{max(xs):.3f}]"
print(f"{'kill -> new epoch (detection) s':<44} {fmt(detect)}")
print(f"{'kill -> in-flight step committed (recovery) s':<44} {fmt(recover)}")
print(f"{'ordinary step s (peer)':<44} {fmt(step)}")
PY
