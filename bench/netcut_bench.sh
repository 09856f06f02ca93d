#!/usr/bin/env bash
# Recovery after a worker's network is cut (elastic membership): a coordinator and 3 workers, one
# of them in its own network namespace joined by a veth pair; after step 20 the test takes the
# link down. Nothing breaks, the worker just goes silent: the coordinator declares it lost after
# cluster.heartbeat_timeout_seconds (the default, 20 s), re-forms the group and the step in flight
# commits. Reported: cut -> new epoch (detection) and cut -> in-flight step committed; the peer is
# the heartbeat timeout itself. Needs root (ip netns). Median of 5 runs.
#   bench/netcut_bench.sh [runs=5]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
work=$(mktemp -d)
ns=fdbench$$
trap 'pkill -9 -f "$work" 2>/dev/null || true; ip netns del $ns 2>/dev/null || true;
      ip link del fdbh$$ 2>/dev/null || true; rm -rf "$work"' EXIT
ip netns add $ns
ip link add fdbh$$ type veth peer name fdbn$$
ip link set fdbn$$ netns $ns
ip addr add 10.213.9.1/30 dev fdbh$$
ip link set fdbh$$ up
ip netns exec $ns ip addr add 10.213.9.2/30 dev fdbn$$
ip netns exec $ns ip link set fdbn$$ up
build/bin/flashdraft make-shards --out "$work/shards" --samples 256 --seq 128 --hidden 64 >/dev/null
/usr/bin/python3 - "$work" "$runs" "$ns" "fdbh$$" <<'PY'
import json, statistics, subprocess, sys, time
work, runs, ns, link = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
detect, recover, step = [], [], []
for run in range(runs):
    out = f"{work}/r{run}"
    subprocess.check_call(["mkdir", "-p", out])
    open(f"{out}/job.yaml", "w").write(f"""output_dir: {out}
drafter: {{num_hidden_layers: 2, block_size: 8, num_target_features: 2, max_anchors: 16}}
data: {{source: shards, shards_dir: {work}/shards, max_seq_len: 128}}
train: {{seed: 0, learning_rate: 0.003, max_steps: 80, global_batch_size: 8}}
cluster: {{listen: '0.0.0.0:0', max_workers: 3}}
checkpoint: {{every_steps: 0}}
metrics: {{enabled: false}}
""")
    log = open(f"{out}.log", "w")
    procs = [subprocess.Popen(["build/bin/flashdraft-coordinator", "--job", f"{out}/job.yaml",
                               "--port-file", f"{out}/port"], stdout=log, stderr=subprocess.STDOUT)]
    while True:
        try:
            port = int(open(f"{out}/port").read())
            break
        except (FileNotFoundError, ValueError):
            time.sleep(0.01)
    address = f"10.213.9.1:{port}"
    procs.append(subprocess.Popen(["ip", "netns", "exec", ns, "build/bin/flashdraft-worker",
                                   "--coordinator", address, "--id", "cut"],
                                  stdout=log, stderr=subprocess.STDOUT))
    for i in range(2):
        procs.append(subprocess.Popen(["build/bin/flashdraft-worker", "--coordinator", address,
                                       "--id", f"host-{i}"], stdout=log, stderr=subprocess.STDOUT))
    def records():
        try:
            return [json.loads(l) for l in open(f"{out}/steps.jsonl") if l.strip()]
        except (FileNotFoundError, json.JSONDecodeError):
            return []
    while True:
        recs = records()
        events = [r for r in recs if r.get("event") == "membership"]
        if sum("step" in r for r in recs) >= 20 and events and events[-1]["world_size"] == 3:
            break
        time.sleep(0.005)
    cut_at = time.time()
    subprocess.check_call(["ip", "link", "set", link, "down"])
    procs[0].wait()
    subprocess.check_call(["ip", "link", "set", link, "up"])
    for p in procs[1:]:
        p.kill()
        p.wait()
    recs = records()
    events = [r for r in recs if r.get("event") == "membership"]
    steps = [r for r in recs if "step" in r]
    after = [r for r in steps if r["unix_time"] > cut_at]
    detect.append(events[-1]["unix_time"] - cut_at)
    recover.append(after[0]["unix_time"] - cut_at)
    step.append(statistics.median(r["step_seconds"] for r in steps[5:20]))
    assert len(steps) == 80 and steps[-1]["world_size"] == 2, "the job did not finish with 2"
print(f"recovery after a network cut of 1 of 3 workers, {runs} runs (median [min..max]), 2 cores")
fmt = lambda xs: f"{statistics.median(xs):.3f} [{min(xs):.3f}..{max(xs):.3f}]"
print(f"{'heartbeat timeout (peer) s':<44} 20.000")
print(f"{'cut -> new epoch (detection) s':<44} {fmt(detect)}")
print(f"{'cut -> in-flight step committed (recovery) s':<44} {fmt(recover)}")
print(f"{'ordinary step s':<44} {fmt(step)}")
PY
