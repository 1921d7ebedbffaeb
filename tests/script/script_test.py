#!/usr/bin/python3
"""Script jobs end to end: `emberctl run --standalone --nproc 4 ddp_train.py -- ARGS` with real
processes on loopback (Debian's torch 1.13, gloo). Run by script_*_test.sh under Bazel:

  script_test.py EMBERCTL SCRIPT MODE
    ddp      the script's losses under Ember equal the same script's under torchrun (same seed);
             the script checks torchrun's environment contract itself (it fails otherwise)
    restart  kill -9 of rank 2 mid-run: attempt 1 runs with TORCHELASTIC_RESTART_COUNT=1, resumes
             from the script's own checkpoint, ends SUCCEEDED, and its losses equal a one-process
             simulation of the same DDP run; attempt 0's store is unreachable and invisible
    standby  while attempt 0 trains, each rank's warm standby for attempt 1 reports ready (the
             file <job dir>/.ember/standby-ready-1-rank-<r>, once torch is imported; what
             script_bench waits for before its kill); after a kill -9 of rank 2 attempt 1 runs in
             those standbys (their log header) and trains on
    hang     rank 1 stops in step 3 (never joins the all-reduce): the job FAILS after the
             script's gloo timeout, naming the first rank that timed out and its last log lines
    root     (as root only) `run --standalone --nproc 2` of the script runs as root, saying so
             once; --script-user nobody runs the ranks as nobody

Every process is bounded by a timeout and killed at exit.
"""
import json, os, signal, subprocess, sys, tempfile, time

EMBERCTL, SCRIPT, MODE = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
PY = "/usr/bin/python3"
TMP = tempfile.mkdtemp(prefix=f"script-{MODE}-", dir=os.environ.get("TEST_TMPDIR"))
procs = []


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    for p in procs:
        if p.poll() is None:
            p.kill()
    sys.exit(1)


def ember(out, args, extra=(), wait=True, timeout=120):
    cmd = [EMBERCTL, "run", "--standalone", "--nproc", "4", "--work-root", f"{TMP}/jobs",
           "--allow-root-scripts", *extra, SCRIPT, "--", "--out", out, *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs.append(p)
    if not wait:
        return p
    try:
        text, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        text, _ = p.communicate()
        logs = ""
        for root, _, names in os.walk(f"{TMP}/jobs"):
            for n in names:
                if n.endswith(".log"):
                    logs += f"--- {n}\n" + open(os.path.join(root, n)).read()[-1500:]
        fail(f"emberctl did not finish in {timeout} s:\n{text}\n{logs}")
    return p.returncode, text


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(out):
    by_step = {}  # step -> loss of the last attempt that ran it
    with open(f"{out}/losses.txt") as f:
        for line in f:
            attempt, step, loss, _ = line.split()
            by_step[int(step)] = (int(attempt), float(loss))
    return by_step


def mode_ddp():
    args = ["--steps", "8"]
    t0 = time.time()
    rc, text = ember(f"{TMP}/ember", args)
    print(f"ember: rc {rc} in {time.time() - t0:.1f} s")
    if rc != 0:
        fail(f"ember run: rc {rc}\n{text}")
    t0 = time.time()
    # --redirects/--tee 0:1: Debian's torch 1.13 under Python 3.11 cannot parse the default "0"
    # (enum Flag iteration skips NONE), so torchrun fails before starting any worker without them.
    tr = subprocess.run([PY, "-m", "torch.distributed.run", "--redirects", "0:1", "--tee", "0:1",
                         "--nproc_per_node", "4", "--master_port", str(free_port()), SCRIPT,
                         "--out", f"{TMP}/torchrun", *args],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
                        cwd=TMP)
    print(f"torchrun: rc {tr.returncode} in {time.time() - t0:.1f} s")
    if tr.returncode != 0:
        fail(f"torchrun: rc {tr.returncode}\n{tr.stdout[-3000:]}")
    a, b = losses(f"{TMP}/ember"), losses(f"{TMP}/torchrun")
    if sorted(a) != list(range(8)) or sorted(b) != list(range(8)):
        fail(f"steps: ember {sorted(a)} torchrun {sorted(b)}")
    for s in range(8):
        if a[s][1] != b[s][1]:
            fail(f"step {s}: ember loss {a[s][1]!r} != torchrun {b[s][1]!r}")
    envs = [json.load(open(f"{TMP}/ember/env-rank-{r}-attempt-0.json")) for r in range(4)]
    job = envs[0]["TORCHELASTIC_RUN_ID"]
    if not os.path.isdir(f"{TMP}/jobs/{job}"):
        fail(f"TORCHELASTIC_RUN_ID {job} is not the job id (no {TMP}/jobs/{job})")
    for r, e in enumerate(envs):
        want = {"RANK": str(r), "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": envs[0]["MASTER_PORT"]}
        for k, v in want.items():
            if e[k] != v:
                fail(f"rank {r}: {k}={e[k]!r}, want {v!r}")
    print(f"PASS: 8 steps, losses equal torchrun's exactly (last {a[7][1]:.6f})")


def mode_restart():
    out = f"{TMP}/ember"
    args = ["--steps", "10", "--step-sleep", "0.3"]
    sim = subprocess.run([PY, SCRIPT, "--simulate-world", "4", "--out", f"{TMP}/sim", *args],
                         capture_output=True, text=True, timeout=60)
    if sim.returncode != 0:
        fail(f"simulation: {sim.stderr[-2000:]}")
    p = ember(out, args, extra=["--max-restarts", "1"], wait=False)
    deadline = time.time() + 90
    while time.time() < deadline:  # attempt 0 trains for real, then rank 2 is killed
        try:
            if any(a == 0 and s >= 3 for s, (a, _) in losses(out).items()):
                break
        except FileNotFoundError:
            pass
        if p.poll() is not None:
            fail(f"emberctl ended early: {p.stdout.read()}")
        time.sleep(0.05)
    else:
        fail("attempt 0 never reached step 3")
    pid = json.load(open(f"{out}/env-rank-2-attempt-0.json"))["pid"]
    os.kill(pid, signal.SIGKILL)
    t_kill = time.time()
    print(f"killed rank 2 (pid {pid}) with SIGKILL")
    try:
        text, _ = p.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        fail("the restarted job did not finish in 90 s")
    if p.returncode != 0:
        fail(f"rc {p.returncode}:\n{text}")
    if "rank 2" not in text or "signal 9" not in text:
        fail(f"the failure of attempt 0 does not name rank 2 and signal 9:\n{text}")
    for r in range(4):
        e = json.load(open(f"{out}/env-rank-{r}-attempt-1.json"))
        if e["TORCHELASTIC_RESTART_COUNT"] != "1" or e["TORCHELASTIC_MAX_RESTARTS"] != "1":
            fail(f"rank {r} attempt 1: {e}")
    got = losses(out)
    resumed = [s for s, (a, _) in got.items() if a == 1]
    if not resumed or min(resumed) == 0:
        fail(f"attempt 1 did not resume from the checkpoint: it ran steps {resumed}")
    first_t = min(float(l.split()[3]) for l in open(f"{out}/losses.txt") if l.startswith("1 "))
    ref = {int(l.split()[0]): float(l.split()[1]) for l in open(f"{TMP}/sim/simulated.txt")}
    if sorted(got) != sorted(ref):
        fail(f"steps {sorted(got)} != {sorted(ref)}")
    worst = max(abs(got[s][1] - ref[s]) / max(1e-12, abs(ref[s])) for s in ref)
    if worst > 1e-5:
        fail(f"losses differ from the one-process simulation by {worst:.2e} (relative)")
    iso = json.load(open(f"{out}/isolation.json"))
    if not iso["port_differs"] or iso["previous_key_visible"] or \
            not iso["stale_connect"].startswith("refused") or \
            iso["socket_connect"] != "ConnectionRefusedError":
        fail(f"attempt isolation: {iso}")
    print(f"PASS: attempt 1 resumed at step {min(resumed)}, its first step {first_t - t_kill:.1f} s "
          f"after the kill; losses equal the simulation (worst {worst:.1e}); stale store: "
          f"{iso['socket_connect']}, torch's client: {iso['stale_connect'][:60]}")


def mode_standby():
    out = f"{TMP}/ember"
    # Long enough that attempt 0 is still training when the standbys (started 3 s into it, then
    # importing torch) are ready; the test stops the job once attempt 1 has trained a step.
    p = ember(out, ["--steps", "1000", "--step-sleep", "0.1"], extra=["--max-restarts", "1"],
              wait=False)
    deadline = time.time() + 150
    job = None
    while time.time() < deadline:
        if p.poll() is not None:
            fail(f"emberctl ended early (rc {p.returncode}): {p.stdout.read()[-3000:]}")
        if job is None and os.path.exists(f"{out}/env-rank-0-attempt-0.json"):
            job = json.load(open(f"{out}/env-rank-0-attempt-0.json"))["TORCHELASTIC_RUN_ID"]
        ready = sorted(os.listdir(f"{TMP}/jobs/{job}/.ember")) if job and \
            os.path.isdir(f"{TMP}/jobs/{job}/.ember") else []
        ready = [n for n in ready if n.startswith("standby-ready-1-rank-")]
        if len(ready) == 4:
            break
        time.sleep(0.05)
    else:
        fail(f"the 4 warm standbys for attempt 1 did not report ready within 150 s (job {job}; "
             f"markers {ready})")
    if sorted(ready) != [f"standby-ready-1-rank-{r}" for r in range(4)]:
        fail(f"ready markers {ready}")
    if any(a != 0 for a, _ in losses(out).values()):
        fail("attempt 0 ended before the standbys were ready")
    shim = f"{TMP}/jobs/{job}/.ember/standby.py"
    standby_pids = set()
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and shim in open(f"/proc/{d}/cmdline", "rb").read().decode(errors="replace"):
                standby_pids.add(int(d))
        except OSError:
            pass
    print(f"standbys ready: {ready}, pids {sorted(standby_pids)}")
    pid = json.load(open(f"{out}/env-rank-2-attempt-0.json"))["pid"]
    os.kill(pid, signal.SIGKILL)
    t_kill = time.time()
    while time.time() < t_kill + 90:
        if any(a == 1 for a, _ in losses(out).values()):
            break
        if p.poll() is not None:
            fail(f"emberctl ended (rc {p.returncode}) before attempt 1 trained: "
                 f"{p.stdout.read()[-3000:]}")
        time.sleep(0.05)
    else:
        fail("attempt 1 trained no step within 90 s of the kill")
    took = time.time() - t_kill
    pids1 = {json.load(open(f"{out}/env-rank-{r}-attempt-1.json"))["pid"] for r in range(4)}
    if not pids1 <= standby_pids:
        fail(f"attempt 1's ranks {sorted(pids1)} are not the ready standbys {sorted(standby_pids)}")
    p.kill()
    print(f"PASS: 4 standbys ready before the kill; attempt 1 ran in them (pids) and trained "
          f"{took:.1f} s after it")


def mode_hang():
    out = f"{TMP}/ember"
    t0 = time.time()
    rc, text = ember(out, ["--steps", "8", "--hang-rank", "1", "--hang-step", "3", "--timeout", "5"])
    took = time.time() - t0
    if rc != 1:
        fail(f"rc {rc} (want 1, FAILED):\n{text}")
    if "FAILED" not in text or "Timed out" not in text:
        fail(f"no timeout in the failure report:\n{text}")
    lines = [l for l in text.splitlines() if "reason:" in l or "last lines of rank" in l]
    if not any("last lines of rank" in l and "rank 1" not in l for l in lines):
        fail(f"the report should name a rank that timed out waiting for rank 1:\n{text}")
    # PyTorch's flight recorder: every rank had TORCH_NCCL_DEBUG_INFO_TEMP_FILE pointing here;
    # torch 1.13 (and gloo in any version) writes nothing, which is what this reports.
    job = os.listdir(f"{TMP}/jobs")
    job = [j for j in job if not j.startswith(".")][0]
    flight = f"{TMP}/jobs/{job}/flight/attempt-0"
    torch_dumps = [n for n in os.listdir(flight) if n.startswith("torch-rank-")]
    print(f"PASS: FAILED after {took:.1f} s: " + " | ".join(l.strip() for l in lines)[:300])
    print(f"PyTorch flight-recorder dumps in {flight}: {torch_dumps or 'none (torch 1.13, gloo)'}")


def mode_root():
    if os.geteuid() != 0:
        print("SKIPPED: not root")
        return
    # A standalone run as root (the default user in most containers) is the invoking user's own
    # script on their own machine: it runs, with one line saying so (issue 30). emberd as root
    # still refuses script jobs without allow_root_scripts (daemon_unit_test).
    out = f"{TMP}/root-ddp"
    r = subprocess.run([EMBERCTL, "run", "--standalone", "--nproc", "2", "--work-root",
                        f"{TMP}/jobs", SCRIPT, "--", "--out", out, "--steps", "2"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail(f"run --standalone --nproc 2 as root: rc {r.returncode}: {r.stderr[-3000:]}")
    said = [l for l in r.stderr.splitlines() if "runs as root" in l]
    if len(said) != 1:
        fail(f"want one line saying the script runs as root, got {said}:\n{r.stderr[-3000:]}")
    if sorted(losses(out)) != [0, 1]:
        fail(f"steps {sorted(losses(out))}, want [0, 1]")
    print(f"PASS: ran as root: {said[0].strip()[:200]}")
    # --script-user nobody: the ranks run as nobody, in a job directory nobody owns.
    root = tempfile.mkdtemp(prefix="script-user-", dir="/tmp")
    try:
        os.chmod(root, 0o755)
        open(f"{root}/whoami.py", "w").write(
            "import os, sys\n"
            "open('out-%s.txt' % os.environ['RANK'], 'w').write('%d %d' % (os.getuid(), os.getgid()))\n"
            "assert os.getuid() != 0\n")
        r = subprocess.run([EMBERCTL, "run", "--standalone", "--nproc", "2", "--work-root",
                            f"{root}/jobs", "--script-user", "nobody",
                            f"{root}/whoami.py"], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            fail(f"--script-user nobody: rc {r.returncode}: {r.stderr}")
        jobdir = [d for d in os.listdir(f"{root}/jobs") if not d.startswith(".")][0]
        import pwd
        nobody = pwd.getpwnam("nobody")
        for rank in range(2):
            path = f"{root}/jobs/{jobdir}/out-{rank}.txt"
            got = open(path).read()
            if got != f"{nobody.pw_uid} {nobody.pw_gid}" or os.stat(path).st_uid != nobody.pw_uid:
                fail(f"rank {rank} ran as uid/gid {got}, wanted nobody's")
        print(f"PASS: --script-user nobody: both ranks ran as uid {nobody.pw_uid}")
    finally:
        subprocess.run(["rm", "-rf", root])


try:
    {"ddp": mode_ddp, "restart": mode_restart, "standby": mode_standby, "hang": mode_hang,
     "root": mode_root}[MODE]()
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
