"""Recovery of a job with 3 worker processes after one of them is lost (elastic membership).

  kill  `flashdraft launch` with 3 workers (no restarts); after step 20 one worker gets SIGKILL.
        Its streams break at once, so detection is immediate (bench/recovery_bench.sh).
  cut   a coordinator and 3 workers, one of them in its own network namespace joined by a veth
        pair; after step 20 the link goes down. Nothing breaks, the worker just goes silent: it is
        declared lost after cluster.heartbeat_timeout_seconds, the default 20 s
        (bench/netcut_bench.sh; needs root for ip netns).

Measured from steps.jsonl, each from the fault: the new membership epoch (detection) and the
commit of the step that was in flight (recovery: detection + re-forming the Gloo group + the state
checksum + re-sending and recomputing the step with W = 2); the peer is the ordinary step time of
the same run. Every run must finish its 80 steps with 2 workers. Median of `runs` runs.

  /usr/bin/python3 bench/recovery_bench.py kill|cut [runs=5]
"""
import json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

STEPS = 80
JOB = """output_dir: {out}
drafter: {{num_hidden_layers: 2, block_size: 8, num_target_features: 2, max_anchors: 16}}
data: {{source: shards, shards_dir: {work}/shards, max_seq_len: 128}}
train: {{seed: 0, learning_rate: 0.003, max_steps: {steps}, global_batch_size: 8}}
cluster: {{listen: '{listen}', max_workers: 3}}
security: {{insecure: true}}
checkpoint: {{every_steps: 0}}
metrics: {{enabled: false}}
"""


def records(out):
    try:
        return [json.loads(l) for l in open(f"{out}/steps.jsonl") if l.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def wait_for_training(out, world_size=3, steps=20):
    while True:
        recs = records(out)
        events = [r for r in recs if r.get("event") == "membership"]
        if sum("step" in r for r in recs) >= steps and events and events[-1]["world_size"] == world_size:
            return
        time.sleep(0.005)


def kill_run(work, out):
    """One run of the kill scenario; returns when it was killed."""
    open(f"{work}/job.yaml", "w").write(
        JOB.format(out=out, work=work, steps=STEPS, listen="127.0.0.1:0"))
    p = subprocess.Popen(["build/bin/flashdraft", "launch", f"{work}/job.yaml", "--workers", "3",
                          "--max-restarts", "0", "--out", out], stdout=open(f"{out}.log", "w"), stderr=subprocess.STDOUT)
    wait_for_training(out)
    port = open(f"{out}/coordinator.port").read().strip()
    pid = int(subprocess.check_output(
        ["pgrep", "-f", f"flashdraft-worker --coordinator 127.0.0.1:{port} --id worker-1"]).split()[0])
    at = time.time()
    os.kill(pid, signal.SIGKILL)
    p.wait()
    return at


def cut_run(work, out, ns, link, host_address):
    """One run of the network-cut scenario; returns when the link went down."""
    os.makedirs(out)
    open(f"{out}/job.yaml", "w").write(JOB.format(out=out, work=work, steps=STEPS, listen="0.0.0.0:0"))
    log = open(f"{out}.log", "w")
    coordinator = subprocess.Popen(["build/bin/flashdraft-coordinator", "--job", f"{out}/job.yaml",
                                    "--port-file", f"{out}/port"], stdout=log, stderr=subprocess.STDOUT)
    while not os.path.exists(f"{out}/port") or not open(f"{out}/port").read().strip():
        time.sleep(0.01)
    address = f"{host_address}:{int(open(f'{out}/port').read())}"
    workers = [subprocess.Popen(["ip", "netns", "exec", ns, "build/bin/flashdraft-worker",
                                 "--coordinator", address, "--id", "cut"], stdout=log, stderr=log)]
    workers += [subprocess.Popen(["build/bin/flashdraft-worker", "--coordinator", address, "--id",
                                  f"host-{i}"], stdout=log, stderr=log) for i in range(2)]
    wait_for_training(out)
    at = time.time()
    subprocess.check_call(["ip", "link", "set", link, "down"])
    coordinator.wait()
    subprocess.check_call(["ip", "link", "set", link, "up"])
    for w in workers:
        w.kill()
        w.wait()
    return at


def main():
    mode, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
    if mode not in ("kill", "cut"):
        sys.exit("usage: recovery_bench.py kill|cut [runs]")
    work = tempfile.mkdtemp()
    ns, link = f"fdbench{os.getpid()}", f"fdbh{os.getpid()}"
    try:
        subprocess.check_call(["build/bin/flashdraft", "make-shards", "--out", f"{work}/shards",
                               "--samples", "256", "--seq", "128", "--hidden", "64"],
                              stdout=subprocess.DEVNULL)
        if mode == "cut":
            for command in (f"ip netns add {ns}", f"ip link add {link} type veth peer name fdbn{os.getpid()}",
                            f"ip link set fdbn{os.getpid()} netns {ns}",
                            f"ip addr add 10.213.9.1/30 dev {link}", f"ip link set {link} up",
                            f"ip netns exec {ns} ip addr add 10.213.9.2/30 dev fdbn{os.getpid()}",
                            f"ip netns exec {ns} ip link set fdbn{os.getpid()} up"):
                subprocess.check_call(command.split())
        detect, recover, step = [], [], []
        for run in range(runs):
            out = f"{work}/r{run}"
            at = kill_run(work, out) if mode == "kill" else cut_run(work, out, ns, link, "10.213.9.1")
            recs = records(out)
            events = [r for r in recs if r.get("event") == "membership"]
            steps = [r for r in recs if "step" in r]
            detect.append(events[-1]["unix_time"] - at)
            recover.append([r for r in steps if r["unix_time"] > at][0]["unix_time"] - at)
            step.append(statistics.median(r["step_seconds"] for r in steps[5:20]))
            assert len(steps) == STEPS and steps[-1]["world_size"] == 2, "the job did not finish with 2"
    finally:
        subprocess.call(["pkill", "-9", "-f", work], stderr=subprocess.DEVNULL)
        if mode == "cut":
            subprocess.call(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
            subprocess.call(["ip", "link", "del", link], stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)
    what = "kill -9 of" if mode == "kill" else "a network cut of"
    print(f"recovery after {what} 1 of 3 workers, {runs} runs (median [min..max]), {os.cpu_count()} cores")
    fmt = lambda xs: f"{statistics.median(xs):.3f} [{min(xs):.3f}..{max(xs):.3f}]"
    fault = "kill" if mode == "kill" else "cut"
    print(f"{fault + ' -> new epoch (detection) s':<44} {fmt(detect)}")
    print(f"{fault + ' -> in-flight step committed (recovery) s':<44} {fmt(recover)}")
    print(f"{'ordinary step s (peer)':<44} {fmt(step)}")


if __name__ == "__main__":
    main()
