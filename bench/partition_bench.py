#!/usr/bin/python3
"""partition_bench (issue 20): the time from a network partition to the job running again on the
remaining hosts. Each run is partition_bench_run.sh: three hosts (network namespaces of
tests/multihost/netns.sh, one emberd each, lease 3 s, restart backoff 0.2 s), a 2-node x 2-rank
FSDP job (the real ember-worker, tiny GPT, checkpoints every 25 steps) past step 60, then the link
of one of its two hosts goes down at t0. Measured from t0, per run:
  (a) others stopped: the reachable host's attempt-0 ranks are gone (/proc, polled every 50 ms);
  (b) running: every attempt-1 rank has recorded its first step (metrics/rank-N.jsonl unix_ms),
      on the two reachable hosts; also shown: the job seen RUNNING with attempt 1 (emberctl,
      polled every 100 ms);
  (c) first new step: every attempt-1 rank has recorded a step past the last one attempt 0
      reached (the steps since the checkpoint redone).

  partition_bench.py --run PATH --netns PATH --store PATH --emberd PATH --emberctl PATH
                     --worker PATH --corpus PATH [--runs N] [--quick] [--json]

Output: bench/report.h's format (bench/bench_schema.json); --json prints one JSON object. Target
(issue 20): partition_to_running_s < lease timeout + 5 s (median of (b)); (a) and (c) are
informational. Needs root for the namespaces: without it, says so and exits 0 with no report.
"""
import argparse, glob, json, os, shutil, statistics, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_bench import emit, load  # noqa: E402  (the same load reading and output)


def records(out):
    """(rank, step, attempt, unix_s) of every metrics record the run copied."""
    rows = []
    for path in glob.glob(os.path.join(out, "rank-*.jsonl")):
        rank = int(path.rsplit("-", 1)[1].split(".")[0])
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    rows.append((rank, int(r["step"]), int(r["attempt"]), int(r["unix_ms"]) / 1000.0))  # int64s are JSON strings
    return rows


def one_run(a, out, log):
    """Returns the run's figures (a dict) or raises RuntimeError."""
    os.makedirs(out)
    cmd = ["bash", a.run, a.netns, a.store, a.emberd, a.emberctl, a.worker, a.corpus, out]
    env = dict(os.environ, TEST_TMPDIR=out)
    p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=180)
    envf = os.path.join(out, "run.env")
    if p.returncode != 0 or not os.path.exists(envf):
        raise RuntimeError(f"partition_bench_run.sh exited {p.returncode} (log: {log.name})")
    e = dict(l.rstrip("\n").split("=", 1) for l in open(envf) if "=" in l)
    t0 = float(e["t0"])
    recs = records(out)
    a0 = max(s for _, s, at, _ in recs if at == 0)
    first, new, resumed = {}, {}, None
    for rank, step, at, t in sorted(recs, key=lambda r: r[3]):
        if at != 1:
            continue
        first.setdefault(rank, (step, t))
        if step > a0:
            new.setdefault(rank, t)
    if len(first) != 4 or len(new) != 4:
        raise RuntimeError(f"attempt-1 records of ranks {sorted(first)}, past step {a0}: {sorted(new)}")
    resumed = min(s for s, _ in first.values()) - 1  # log_every 1: the first record is resumed + 1
    return {"cut": e["cut"], "a0_step": a0, "resumed": resumed,
            "stopped": float(e["stop_s"]), "scheduled": float(e["running"]) - t0,
            "running": max(t for _, t in first.values()) - t0,
            "new_step": max(new.values()) - t0, "lease_s": float(e["lease_s"]),
            "hosts": e["attempt1_hosts"], "reason": e["reason"]}


def absolute(name, value, goal, unit, note):
    met = value < goal
    return {"name": name, "value": value, "peer": None, "goal": goal, "goal_applies_to": "value",
            "higher_is_better": False, "unit": unit, "compared": value, "met": met,
            "status": "met" if met else f"missed by {abs(value - goal) / goal * 100:.1f}%",
            "reason": None, "note": note}


def main():
    ap = argparse.ArgumentParser()
    for f in ("run", "netns", "store", "emberd", "emberctl", "worker", "corpus"):
        ap.add_argument("--" + f, required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--allow-missing-peers", action="store_true", help="accepted: no peer here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print(f"SKIPPED: partition_bench needs root for network namespaces (uid {os.geteuid()})",
              file=sys.stderr)
        return 0
    for f in ("run", "netns", "store", "emberd", "emberctl", "worker", "corpus"):
        setattr(a, f, os.path.abspath(getattr(a, f)))
    runs = 1 if a.quick else a.runs
    tmp = tempfile.mkdtemp(prefix="partition_bench-", dir=os.environ.get("TEST_TMPDIR"))
    log = open(os.path.join(tmp, "runs.log"), "w")
    lb = load()
    rows, res = [], []
    for r in range(runs):
        try:
            x = one_run(a, os.path.join(tmp, f"run{r}"), log)
        except (RuntimeError, OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
            log.flush()
            sys.stderr.write(open(log.name).read()[-4000:])
            print(f"partition_bench: run {r} failed: {e}", file=sys.stderr)
            return 1
        res.append(x)
        rows.append([r, x["cut"], x["a0_step"], x["resumed"], x["stopped"], x["scheduled"],
                     x["running"], x["new_step"]])
        print(f"run {r}: {rows[-1][1:]}", file=sys.stderr)
    le = load()
    med = {k: statistics.median(x[k] for x in res)
           for k in ("stopped", "scheduled", "running", "new_step")}
    rows.append(["median", None, None, None, med["stopped"], med["scheduled"], med["running"],
                 med["new_step"]])
    lease = res[0]["lease_s"]
    goal = lease + 5
    targets = [
        absolute("partition_to_running_s", med["running"], goal, "s",
                 f"issue 20: < lease timeout + 5 s; the lease here is {lease:g} s (netns.sh "
                 "MH_LEASE_S), restart backoff 0.2 s; running = every attempt-1 rank has recorded "
                 "its first step on the reachable hosts"),
        absolute("partition_to_others_stopped_s", med["stopped"], goal, "s",
                 "informational (partition_test.sh's bound): the reachable host's attempt-0 "
                 "ranks gone"),
        absolute("partition_to_first_new_step_s", med["new_step"], goal, "s",
                 "informational: every attempt-1 rank past the last step attempt 0 reached "
                 "(the steps since the checkpoint redone)"),
    ]
    report = {
        "benchmark": "partition_bench",
        "command": os.environ.get("PARTITION_BENCH_COMMAND", " ".join(sys.argv)),
        "quick": bool(a.quick), "load_begin": lb, "load_end": le,
        "tables": [{
            "title": f"partition (link down) of one of a 2-node x 2-rank FSDP job's hosts, 3 hosts "
                     f"(network namespaces), lease {lease:g} s: seconds from the link down",
            "columns": ["run", "cut host", "attempt-0 last step", "resumed from step",
                        "others stopped s", "attempt 1 RUNNING s", "attempt 1 first step s",
                        "first new step s"],
            "rows": rows, "load_begin": lb, "load_end": le,
            "notes": [f"the lease timeout is {lease:g} s (every emberd's --lease-ttl-s in "
                      "tests/multihost/netns.sh); restart backoff 0.2 s; checkpoints every 25 steps",
                      "others stopped: the reachable host's attempt-0 ranks gone (/proc, 50 ms polls)",
                      "attempt 1 RUNNING: the job's state through emberctl (100 ms polls)",
                      "attempt 1 first step / first new step: the latest of the 4 ranks' metrics "
                      "records (unix_ms) of their first step / first step past attempt 0's last"],
        }],
        "targets": targets,
        "meta": {"runs": runs, "lease_s": lease, "goal_s": goal, "cores": os.cpu_count()},
    }
    shutil.rmtree(tmp, ignore_errors=True)
    emit(report, rows, a.json, lambda t: f"{t['name']}: {t['value']:.2f} s (goal < {t['goal']:g} s, "
         f"lease {lease:g} s) -> {t['status']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
