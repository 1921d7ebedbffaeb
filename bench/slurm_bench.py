#!/usr/bin/python3
"""slurm_bench (issue 36): sbatch to the first training step of a PyTorch DDP script
(tests/script/ddp_train.py, gloo, CPU), Ember vs `srun torchrun`, in the same allocation shape.

It starts its own Slurm cluster (munged, slurmctld and one slurmd per node on this host, private
ports; tests/slurm/slurm_cluster.sh) and per round submits, interleaved and in alternating order:

  ember:    an sbatch whose batch script runs
              emberctl run --slurm --nproc 4 --python PY ddp_train.py -- ARGS
            (Ember's script-job mode: one node daemon per node via srun, the first hosts the store,
            then the 4 ranks);
  torchrun: an sbatch of the same shape whose batch script runs
              srun --nodes=N --ntasks=N --ntasks-per-node=1 --overlap --whole --kill-on-bad-exit=1 \\
                PY -m torch.distributed.run --nnodes N --nproc_per_node R --rdzv-backend c10d \\
                  --rdzv-endpoint HEAD:PORT --rdzv-id $SLURM_JOB_ID ddp_train.py ARGS
            (the srun flags are the ones Ember starts its node daemons with).

Both run the same script with the same interpreter (PY: deploy/peers-venv.sh --python, torch
2.15) and the same ARGS (--steps, --step-sleep, --expect-nodes N). Measured: `sbatch` is called ->
rank 0 logs step 0 (the script stamps each step with time.time() in OUT/losses.txt), then the job
must end COMPLETED with exit code 0:0. Each round's job runs alone on the cluster.

Shape: 2 nodes x 2 ranks when this host has a non-loopback IPv4 address (the nodes' NodeAddr:
both slurmd run here; Ember refuses a multi-node script job whose MASTER_ADDR is loopback, rightly
so), else 1 node x 4 ranks; the output says which and why.

torchrun on this one-host cluster: every "node" has the hostname of this host, which resolves to
loopback, so torchrun's own look-ups (is this node the rendezvous host? what is my address?)
would answer wrongly; the batch script passes what they return on a real cluster:
`--rdzv-conf is_host=1` on the batch node only, and `--local-addr <its NodeAddr>` on each.
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 is set for torchrun as in //bench:script_bench: it is the
configuration in which torch 2.15's torchrun can restart a Gloo script at all (without it the
restarted ranks read attempt 0's Gloo addresses from the shared rendezvous store), so it is the
torchrun a user with --max_restarts runs; with it, rank 0 hosts the workers' TCPStore
(MASTER_PORT) in init_process_group instead of reusing the rendezvous store. Neither side restarts
here (both launchers' default, max restarts 0).

A failed round fails the run (exit 1, no report): never a median of the rounds that worked. The
cluster's daemons and jobs are stopped by PID at the end, also on an error or SIGTERM/SIGINT.

  slurm_bench.py --emberctl PATH --script PATH --slurm-lib DIR --python PY
                 [--rounds N (>= 3)] [--quick] [--json] [--peer=false] [--allow-missing-peers]
                 [--nodes 0|1|2]

Output: bench/report.h's format (bench/bench_schema.json); --json prints one JSON object on
stdout (progress on stderr). Goal (issue 36): Ember's sbatch-to-first-step <= 0.5x torchrun's.
"""
import argparse, json, os, re, shutil, signal, socket, statistics, subprocess, sys, tempfile, time

STEPS, STEP_SLEEP = 3, 0.1  # the job ends soon after step 0; only step 0 is timed
FIRST_STEP_S = 240          # a job whose rank 0 has not logged step 0 by then fails the round
END_S = 120                 # ... or that has not ended this long after its first step
GOAL = 0.5


def load():
    try:
        a = open("/proc/loadavg").read().split()
        return {"1m": float(a[0]), "5m": float(a[1]), "15m": float(a[2])}
    except OSError:
        return {"1m": None, "5m": None, "15m": None}


def cpu_name():
    try:
        for l in open("/proc/cpuinfo"):
            if l.startswith("model name"):
                return l.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def log(msg):
    print(f"slurm_bench: {msg}", file=sys.stderr, flush=True)


class Failed(Exception):
    pass


def host_ipv4():
    """This host's first non-loopback IPv4 address, or None."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                             capture_output=True, text=True, timeout=10).stdout
        for m in re.finditer(r"\binet (\d+\.\d+\.\d+\.\d+)/", out):
            return m.group(1)
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        for a in socket.gethostbyname_ex(socket.gethostname())[2]:
            if not a.startswith("127."):
                return a
    except OSError:
        pass
    return None


def free_port():
    s = socket.socket()
    s.bind(("", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Cluster:
    """The private Slurm cluster of tests/slurm/slurm_cluster.sh under DIR; stop() is idempotent
    and stops every daemon (and job) it started, by PID."""

    def __init__(self, lib, d, nodes, cpus, addr):
        self.lib, self.d = lib, d
        self.env = dict(os.environ)
        self.env.update(SLURM_TEST_NODES=str(nodes), SLURM_TEST_CPUS=str(cpus),
                        SLURM_CONF=os.path.join(d, "slurm.conf"),
                        PATH=os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin",
                        # Scheduled on submission, not on slurmctld's next pass (up to 3 s later,
                        # a random share of either side's time).
                        SLURM_TEST_SCHEDULER_PARAMETERS="batch_sched_delay=0")
        if addr:
            self.env["SLURM_TEST_NODE_ADDR"] = addr
        self.started = False

    def _sh(self, what, timeout):
        return subprocess.run(["bash", "-c", f'. "{self.lib}/slurm_cluster.sh" && {what} "$0"',
                               self.d], env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def start(self):
        self.started = True  # even a failed start may have left daemons: stop() looks
        p = self._sh("slurm_start", 90)
        if p.returncode != 0:
            raise Failed(f"the Slurm cluster did not start: {p.stderr.strip()[-1500:]}")

    def stop(self):
        if self.started:
            self.started = False
            try:
                self._sh("slurm_stop", 120)
            except subprocess.TimeoutExpired:
                log(f"slurm_stop {self.d} took over 120 s")

    def wait_idle(self, nodes):
        """Until every node is idle again (the previous job's clean-up is done); raises Failed
        after 60 s."""
        end = time.time() + 60
        while True:
            p = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env,
                               capture_output=True, text=True, timeout=30)
            states = p.stdout.split()
            if len(states) == nodes and all(x == "idle" for x in states):
                return
            if time.time() > end:
                raise Failed(f"the nodes are not idle 60 s after the previous job: {states}")
            time.sleep(0.1)

    def job(self, jid):
        """(JobState, ExitCode) of a job, ("", "") when scontrol does not answer."""
        p = subprocess.run(["scontrol", "show", "job", "-o", jid], env=self.env,
                           capture_output=True, text=True, timeout=30)
        st = re.search(r"\bJobState=(\S+)", p.stdout)
        ec = re.search(r" ExitCode=(\S+)", p.stdout)
        return (st.group(1) if st else "", ec.group(1) if ec else "")


FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def q(s):
    return "'" + str(s).replace("'", "'\\''") + "'"


def batch_script(kind, a, out, work_root, port, nodes, per_node):
    args = ["--out", out, "--steps", str(STEPS), "--step-sleep", str(STEP_SLEEP),
            "--expect-nodes", str(nodes), "--no-isolation-check"]
    head = ["#!/bin/bash",
            f"# slurm_bench {kind}: {nodes} node(s) x {per_node} ranks",
            # bash's own clock (no fork): when the batch script starts, the same on both sides
            f'echo "$EPOCHREALTIME" > {q(os.path.join(out, "batch-start"))}']
    if kind == "ember":
        return "\n".join(head + [
            f"exec {q(a.emberctl)} run --slurm --nproc {nodes * per_node} --work-root "
            f"{q(work_root)} --python {q(a.python)} {q(a.script)} -- "
            + " ".join(q(x) for x in args)]) + "\n"
    # torchrun: the batch node is the rendezvous host; every node's NodeAddr from one scontrol.
    return "\n".join(head + [
        "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1  # as in script_bench (slurm_bench.py's docstring)",
        "export SLURM_BENCH_ADDRS=\"$(scontrol -o show node \"$SLURM_JOB_NODELIST\" | "
        "sed -n 's/^NodeName=\\([^ ]*\\) .* NodeAddr=\\([^ ]*\\) .*/\\1=\\2/p')\"",
        "export SLURM_BENCH_HEAD=\"$SLURMD_NODENAME\"",
        "head_addr=$(for p in $SLURM_BENCH_ADDRS; do [ \"${p%%=*}\" = \"$SLURM_BENCH_HEAD\" ] && "
        "echo \"${p#*=}\"; done)",
        "exec srun --nodes=\"$SLURM_NNODES\" --ntasks=\"$SLURM_NNODES\" --ntasks-per-node=1 "
        "--overlap --whole --kill-on-bad-exit=1 bash -c '"
        "for p in $SLURM_BENCH_ADDRS; do [ \"${p%%=*}\" = \"$SLURMD_NODENAME\" ] && a=${p#*=}; done; "
        "exec \"$0\" -m torch.distributed.run --local-addr \"$a\" "
        "--rdzv-conf is_host=$([ \"$SLURMD_NODENAME\" = \"$SLURM_BENCH_HEAD\" ] && echo 1 || echo 0) "
        f"\"$@\"' {q(a.python)} "
        f"--nnodes \"$SLURM_NNODES\" --nproc_per_node {per_node} --rdzv-backend c10d "
        f"--rdzv-endpoint \"$head_addr:{port}\" --rdzv-id \"$SLURM_JOB_ID\" {q(a.script)} "
        + " ".join(q(x) for x in args)]) + "\n"


def first_step(out):
    """time.time() of rank 0's step 0 (attempt 0), or None."""
    try:
        with open(os.path.join(out, "losses.txt")) as f:
            for l in f:
                p = l.split()
                if len(p) == 4 and p[0] == "0" and p[1] == "0":
                    return float(p[3])
    except (FileNotFoundError, ValueError):
        pass
    return None


def mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def one_job(kind, rnd, a, c, tmp, nodes, per_node):
    """Returns the row of one sbatch: [sbatch->first step, sbatch->batch script, batch script ->
    rank 0 process, rank 0 torch import, import -> first step, the last rank's import -> first
    step, Ember: batch script -> store up, Ember: batch script -> job submitted, sbatch -> job
    ended] (seconds; None where it does not apply). Raises Failed."""
    out = os.path.join(tmp, f"{kind}-{rnd}")
    work_root = os.path.join(tmp, f"jobs-{rnd}")
    os.makedirs(out)
    path = os.path.join(tmp, f"{kind}-{rnd}.sbatch")
    with open(path, "w") as f:
        f.write(batch_script(kind, a, out, work_root, free_port(), nodes, per_node))
    slog = os.path.join(tmp, f"{kind}-{rnd}.out")
    c.wait_idle(nodes)
    cmd = ["sbatch", "--parsable", f"--nodes={nodes}", f"--ntasks-per-node={per_node}",
           f"--job-name=bench-{kind}", f"--output={slog}", path]
    t0 = time.time()
    p = subprocess.run(cmd, env=c.env, capture_output=True, text=True, timeout=60, cwd=tmp)
    if p.returncode != 0:
        raise Failed(f"{kind}: sbatch exited {p.returncode}: {p.stderr.strip()}")
    jid = p.stdout.strip().split(";")[0]

    def tail():
        try:
            return open(slog, errors="replace").read()[-3000:]
        except OSError:
            return "(no output file)"

    first, next_poll, deadline = None, 0.0, t0 + FIRST_STEP_S
    while first is None:
        first = first_step(out)
        if first is not None:
            break
        now = time.time()
        if now > deadline:
            raise Failed(f"{kind}: job {jid}: no step 0 from rank 0 within {FIRST_STEP_S} s "
                         f"of sbatch\n{tail()}")
        if now >= next_poll:  # a job that ended without a step: fail now, not at the deadline
            st, ec = c.job(jid)
            if st in FINAL and first_step(out) is None:
                raise Failed(f"{kind}: job {jid} ended {st} (exit {ec}) before step 0\n{tail()}")
            next_poll = now + 1.0
        time.sleep(0.02)
    end_deadline = time.time() + END_S
    while True:
        st, ec = c.job(jid)
        if st in FINAL:
            break
        if time.time() > end_deadline:
            raise Failed(f"{kind}: job {jid} still {st} {END_S} s after its first step\n{tail()}")
        time.sleep(0.2)
    t_end = time.time()
    if st != "COMPLETED" or ec != "0:0":
        raise Failed(f"{kind}: job {jid} ended {st}, exit {ec} (want COMPLETED, 0:0)\n{tail()}")
    try:
        batch = float(open(os.path.join(out, "batch-start")).read().strip())
        env0 = os.path.join(out, "env-rank-0-attempt-0.json")
        imp = json.load(open(env0))["import_s"]
        rank0_start = mtime(env0) - imp  # the env file is written right after the imports
        # The slowest rank: step 0 needs every rank's imports (then Gloo set-up, DDP, the step).
        ends = [mtime(os.path.join(out, f)) for f in os.listdir(out)
                if f.startswith("env-rank-") and f.endswith("-attempt-0.json")]
        if len(ends) != nodes * per_node or None in ends:
            raise ValueError(f"{len(ends)} env-rank-*-attempt-0.json files for "
                             f"{nodes * per_node} ranks")
        last_import = max(ends)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Failed(f"{kind}: job {jid}: a time stamp is missing ({e})\n{tail()}")
    store = submitted = None
    if kind == "ember":
        run_dir = os.path.join(work_root, f".slurm-{jid}")
        n0 = mtime(os.path.join(run_dir, "node-0"))  # the first node's daemon (store) is up
        store = n0 - batch if n0 else None
        jobs = [d for d in os.listdir(work_root) if not d.startswith(".")] \
            if os.path.isdir(work_root) else []
        js = mtime(os.path.join(work_root, jobs[0], "job.yaml")) if len(jobs) == 1 else None
        submitted = js - batch if js else None
    return [first - t0, batch - t0, rank0_start - batch, imp, first - (rank0_start + imp),
            first - last_import, store, submitted, t_end - t0]


def warm_up(c, tmp, nodes, per_node):
    """One untimed job of the same shape (`srun true` on every node) before the rounds: the first
    job on a fresh cluster waits seconds longer to start (slurmctld and each slurmd's first
    launch), which would be charged to whichever launcher happens to go first. Returns its
    sbatch-to-end seconds; raises Failed unless it ends COMPLETED, 0:0."""
    t0 = time.time()
    p = subprocess.run(["sbatch", "--parsable", f"--nodes={nodes}", f"--ntasks-per-node={per_node}",
                        "--job-name=bench-warm-up", f"--output={os.path.join(tmp, 'warm-up.out')}",
                        "--wrap", f"srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 true"],
                       env=c.env, capture_output=True, text=True, timeout=60, cwd=tmp)
    if p.returncode != 0:
        raise Failed(f"warm-up: sbatch exited {p.returncode}: {p.stderr.strip()}")
    jid = p.stdout.strip().split(";")[0]
    while time.time() < t0 + END_S:
        st, ec = c.job(jid)
        if st in FINAL:
            if st != "COMPLETED" or ec != "0:0":
                raise Failed(f"warm-up: job {jid} ended {st}, exit {ec} (want COMPLETED, 0:0)")
            return time.time() - t0
        time.sleep(0.2)
    raise Failed(f"warm-up: job {jid} did not end within {END_S} s")


def target(value, peer, reason, note):
    t = {"name": "sbatch_to_first_step_s", "value": value, "peer": peer, "goal": GOAL,
         "goal_applies_to": "value/peer", "higher_is_better": False, "unit": "s",
         "compared": None, "met": False, "status": f"not measured: {reason}", "reason": reason,
         "note": note}
    if value is not None and peer:
        r = value / peer
        t.update(compared=r, met=r <= GOAL, reason=None,
                 status="met" if r <= GOAL else f"missed by {abs(r - GOAL) / GOAL * 100:.1f}%")
    return t


def torch_version(py):
    p = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                       capture_output=True, text=True, timeout=60)
    return p.stdout.strip() or "?"


def run(a, tmp):
    lb = load()
    cpu = f"{cpu_name()}, {os.cpu_count()} cores"
    tv = torch_version(a.python)
    peer_reason = None
    if a.peer == "false":
        peer_reason = "torchrun skipped (--peer=false)"
    elif not tv.startswith("2.15"):
        peer_reason = (f"{a.python} has torch {tv}, not the torch 2.15 peer (deploy/peers-venv.sh "
                       "creates it)")
    addr = host_ipv4() if a.nodes != 1 else None
    if a.nodes == 2 and not addr:
        raise Failed("--nodes 2: this host has no non-loopback IPv4 address for the nodes' "
                     "NodeAddr (Ember refuses a multi-node script job on loopback)")
    nodes = 2 if addr else 1
    per_node = 4 // nodes
    why = (f"2 nodes (two slurmd on this host, NodeAddr {addr}) x 2 ranks" if nodes == 2 else
           "1 node x 4 ranks (" + ("--nodes 1" if a.nodes == 1 else
                                  "no non-loopback IPv4 address here for a 2-node cluster") + ")")
    log(f"CPU: {cpu}; load at start {lb['1m']}/{lb['5m']}/{lb['15m']}; shape: {why}; "
        f"python {a.python} (torch {tv})")
    c = Cluster(a.slurm_lib, os.path.join(tmp, "slurm"), nodes, per_node, addr)
    kinds = ["ember"] + ([] if peer_reason else ["torchrun"])
    rows, res = [], {k: [] for k in kinds}
    try:
        t = time.time()
        c.start()
        log(f"Slurm cluster up in {time.time() - t:.1f} s ({c.d})")
        log(f"warm-up job (not timed): {warm_up(c, tmp, nodes, per_node):.2f} s")
        for r in range(a.rounds):
            for kind in (kinds if r % 2 == 0 else kinds[::-1]):  # interleaved, alternating
                row = one_job(kind, r, a, c, tmp, nodes, per_node)
                res[kind].append(row[0])
                rows.append([r, kind] + row)
                log(f"round {r} {kind}: sbatch -> first step {row[0]:.2f} s (" +
                    ", ".join("-" if x is None else f"{x:.2f}" for x in row[1:]) + ")")
    finally:
        c.stop()
    le = load()
    log(f"load at end {le['1m']}/{le['5m']}/{le['15m']}")
    med = {k: statistics.median(v) for k, v in res.items()}
    for k in kinds:
        rows.append(["median", k, med[k]] + [None] * 8)
    same = (f"the same script, interpreter and torch ({a.python}, torch {tv}), arguments "
            f"(--steps {STEPS} --step-sleep {STEP_SLEEP} --expect-nodes {nodes}) and allocation "
            f"(sbatch --nodes={nodes} --ntasks-per-node={per_node}: {why}) on both; {a.rounds} "
            "interleaved rounds (alternating order), medians; max restarts 0 on both (defaults)")
    tgt = target(med["ember"], med.get("torchrun"), peer_reason,
                 "value = Ember (`emberctl run --slurm` in the batch script), peer = `srun "
                 "torchrun --rdzv-backend c10d` (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1); goal: "
                 f"Ember <= {GOAL}x; {same}; CPU: {cpu}")
    notes = [
        f"cluster: a private slurmctld + {nodes} slurmd on this host ({why}); CPU: {cpu}",
        "sbatch -> first step: `sbatch` is called -> rank 0 logs step 0 (time.time() in "
        "OUT/losses.txt); the job then has to end COMPLETED, exit 0:0",
        "sbatch -> batch script: Slurm schedules and starts the batch script (it writes bash's "
        "$EPOCHREALTIME first); identical work on both sides; an untimed warm-up job (srun true on "
        "every node) runs first, since a fresh cluster's first job starts seconds later; each "
        "sbatch waits for every node to be idle; SchedulerParameters=batch_sched_delay=0 (a job "
        "is scheduled on submission, not on slurmctld's next pass up to 3 s later)",
        "batch script -> rank 0 process: the launcher's part. Ember: srun of a node daemon per "
        "node, the store on the first, registration, job submission, rank spawn; torchrun: srun "
        "of torchrun per node, its import, the c10d rendezvous, rank spawn",
        "rank 0 torch import: the script's own `import torch` (import_s); import -> first step: "
        "waiting for the other ranks' imports, init_process_group (Gloo), DDP set-up, step 0; "
        "last rank imported -> first step: the same without the wait (the env-rank-*.json each "
        "rank writes right after its imports)",
        "Ember only: batch script -> store up (node-0 written by the first node's daemon) and -> "
        "job submitted (job.yaml written)",
        "torchrun: --rdzv-conf is_host=1 on the batch node and --local-addr NodeAddr, which "
        "torchrun finds by itself on a real cluster (here every node is this host, whose name "
        "resolves to loopback); TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 as in script_bench",
        "every round must succeed: a failed round fails the run",
    ]
    return {
        "benchmark": "slurm_bench",
        "command": (os.environ.get("SLURM_BENCH_COMMAND") or
                    " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])).strip(),
        "quick": bool(a.quick), "load_begin": lb, "load_end": le,
        "tables": [{
            "title": f"sbatch to first step of a 4-rank DDP script (gloo, CPU): Ember vs srun "
                     f"torchrun, {why}",
            "columns": ["round", "launcher", "sbatch to first step s", "sbatch to batch script s",
                        "batch script to rank 0 process s", "rank 0 torch import s",
                        "import to first step s", "last rank imported to first step s",
                        "Ember: batch script to store up s",
                        "Ember: batch script to job submitted s", "sbatch to job ended s"],
            "rows": rows, "load_begin": lb, "load_end": le, "notes": notes}],
        "targets": [tgt],
        "meta": {"rounds": a.rounds, "cpu": cpu_name(), "cores": os.cpu_count(), "nodes": nodes,
                 "ranks_per_node": per_node, "node_addr": addr or "127.0.0.1", "steps": STEPS,
                 "step_sleep_s": STEP_SLEEP, "python": a.python, "torch": tv},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--emberctl", required=True)
    ap.add_argument("--script", required=True)
    ap.add_argument("--slurm-lib", required=True, help="the directory of slurm_cluster.sh")
    ap.add_argument("--python", default=os.environ.get("EMBER_PEER_PYTHON", "/usr/bin/python3"))
    ap.add_argument("--rounds", type=int, default=3, help="at least 3 (--quick: 1)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--allow-missing-peers", action="store_true")
    ap.add_argument("--peer", default="true", help="false: skip torchrun")
    ap.add_argument("--nodes", type=int, default=0, choices=[0, 1, 2],
                    help="0: 2 when this host has a non-loopback IPv4 address, else 1")
    a = ap.parse_args()
    if not a.quick and a.rounds < 3:
        print(f"slurm_bench: --rounds={a.rounds}: at least 3 rounds (a median of fewer is one "
              "run's luck); --quick runs 1", file=sys.stderr)
        return 2
    if a.quick:
        a.rounds = 1
    a.emberctl, a.script = os.path.abspath(a.emberctl), os.path.abspath(a.script)
    a.slurm_lib = os.path.abspath(a.slurm_lib)

    def on_signal(sig, _):
        raise SystemExit(f"slurm_bench: signal {sig}: stopping the Slurm cluster")
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    # Short: Ember's run directory and slurmd's spool hold Unix sockets (108-byte paths).
    tmp = tempfile.mkdtemp(prefix="slurm_bench-", dir=os.environ.get("TEST_TMPDIR"))
    try:
        report = run(a, tmp)
    except (Failed, OSError, subprocess.SubprocessError, ValueError) as e:
        # A failed round fails the run: no report from the rounds that happened to work.
        print(f"slurm_bench: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    t = report["targets"][0]
    if a.json:
        print(json.dumps(report))
    else:
        tab = report["tables"][0]
        print(tab["title"])
        print(" | ".join(tab["columns"]))
        for row in tab["rows"]:
            print(" | ".join("-" if x is None else (f"{x:.2f}" if isinstance(x, float) else str(x))
                             for x in row))
        for n in tab["notes"]:
            print(f"  - {n}")
        lb, le = report["load_begin"], report["load_end"]
        print(f"load (1/5/15 min) at start {lb['1m']}/{lb['5m']}/{lb['15m']}, at end "
              f"{le['1m']}/{le['5m']}/{le['15m']}")
        print(f"{t['name']}: {t['value']} vs {t['peer']} -> {t['status']}")
    if a.json and t["compared"] is None and not a.allow_missing_peers:
        print("slurm_bench: the target is not measured; exiting 3", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
