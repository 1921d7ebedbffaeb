#!/usr/bin/python3
"""regression_bench: no speed regression from issue 32's composition (the model driver, FullyShard
and pipeline stages as FullyShard-sharded parts), measured against the last commit before it.

"before" is a `git worktree` of --before (default 5f7bda2, main before issue 32) built with bazel in
its own directory (so its own output base; the shared disk cache makes a rebuild cheap), by default
~/.cache/ember-bench/before-<commit>. "after" is the current tree: the binaries this script is given
(//bench:regression_bench's runfiles, which bench/run.sh builds from the working tree). Both sides
run in ONE run, interleaved per round (before, after, before, after, ...), on the same machine:

  main job:  `emberctl run --standalone --worker <that side's ember-worker> examples/tiny-gpt.yaml`
             (the same spec file and data on both sides: FSDP on 4 CPU ranks, 150 steps; the
             worker's threads per rank come from the cores, 1 on 2 cores, read back from each
             side's rank-0 log and required equal). tokens/s = tokens per step x steps / time
             between the first and the last logged step (rank 0's metrics/rank-0.jsonl
             timestamps: steps 10..150, start-up and the first 10 steps excluded).
  pipeline:  that side's `pipeline_bench --json --rounds=1 --steps=N` (the same source file on both
             sides; 2 ranks, 1 compute thread each, 8 micro-batches); its "1f1b" row's tok/s
             (global tokens per step / median over steps of the slowest rank's step time). The
             after side also gets --pp_fsdp=false (its PP x FSDP memory row is not timed).

Each side runs once unmeasured first (page cache, binaries loaded). Per target: value = the after
side's median over rounds, peer = the before side's median; goal after/before >= 0.97.

  regression_bench.py --emberctl P --worker P --pipeline-bench P --spec P [--before COMMIT]
                      [--tree DIR] [--repo DIR] [--rounds N (>= 3)] [--steps N] [--quick] [--json]
                      [--no-build]

Output: bench/report.h's format (bench/bench_schema.json); --json prints one JSON object. A side
or round that fails fails the run (exit 1, no report).
"""
import argparse, glob, json, os, re, shutil, statistics, subprocess, sys, tempfile, time

GOAL = 0.97
BEFORE_DEFAULT = "5f7bda2"
TARGETS = ["//bench:pipeline_bench", "//launcher:emberctl", "//runtime/worker:ember-worker"]


def load():
    try:
        a = open("/proc/loadavg").read().split()
        return {"1m": float(a[0]), "5m": float(a[1]), "15m": float(a[2])}
    except OSError:
        return {"1m": None, "5m": None, "15m": None}


def log(msg):
    print(f"regression_bench: {msg}", file=sys.stderr, flush=True)


def git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)


def find_repo(arg):
    """The git repository that holds the before commit: --repo, else the one around the working
    directory (bench/run.sh runs from the repository root), else around this script's source."""
    for d in ([arg] if arg else []) + [os.getcwd(), os.path.dirname(os.path.realpath(__file__))]:
        r = git(d, "rev-parse", "--show-toplevel")
        if r.returncode == 0:
            return r.stdout.strip()
    raise RuntimeError("no git repository found: pass --repo DIR (a clone holding the before "
                       "commit)")


def prepare_before(a):
    """Creates (if missing) the before worktree and builds its binaries; returns their paths."""
    repo = find_repo(a.repo)
    full = git(repo, "rev-parse", "--verify", a.before + "^{commit}")
    if full.returncode != 0:
        raise RuntimeError(f"--before {a.before}: not a commit of {repo}: {full.stderr.strip()}")
    commit = full.stdout.strip()
    tree = a.tree or os.path.join(os.path.expanduser("~/.cache/ember-bench"),
                                  "before-" + commit[:7])
    if not os.path.isdir(tree):
        os.makedirs(os.path.dirname(tree), exist_ok=True)
        r = git(repo, "worktree", "add", "--detach", tree, commit)
        if r.returncode != 0:
            raise RuntimeError(f"git worktree add {tree} {commit[:7]}: {r.stderr.strip()}")
    head = git(tree, "rev-parse", "HEAD").stdout.strip()
    if head != commit:
        raise RuntimeError(f"{tree} is at {head[:7] or '?'}, not {commit[:7]}: remove it "
                           f"(git worktree remove {tree}) or pass another --tree")
    if git(tree, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise RuntimeError(f"{tree} has local changes: it must be the commit as it is")
    bins = {"emberctl": "launcher/emberctl", "worker": "runtime/worker/ember-worker",
            "pipeline_bench": "bench/pipeline_bench"}
    bins = {k: os.path.join(tree, "bazel-bin", v) for k, v in bins.items()}
    if not a.no_build or not all(os.path.exists(p) for p in bins.values()):
        t0 = time.time()
        log(f"building {commit[:7]} in {tree} (its own output base)")
        with open(os.path.join(tree, "regression_bench-build.log"), "w") as out:
            r = subprocess.run(["bazel", "build", "--jobs=2", *TARGETS], cwd=tree, stdout=out,
                               stderr=subprocess.STDOUT)
            # Its server would idle beside the measurement; the disk cache keeps the next build
            # cheap.
            subprocess.run(["bazel", "shutdown"], cwd=tree, stdout=out, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            raise RuntimeError(f"bazel build in {tree} failed (rc {r.returncode}); see "
                               f"{tree}/regression_bench-build.log")
        log(f"built in {time.time() - t0:.0f} s")
    for p in bins.values():
        if not os.access(p, os.X_OK):
            raise RuntimeError(f"{p} missing after the build")
    return commit, tree, bins


def main_job(side, emberctl, worker, spec, tmp):
    """Runs the main job once; returns (tokens/s, tokens per step, steps timed, threads)."""
    root = tempfile.mkdtemp(prefix=f"jobs-{side}-", dir=tmp)
    with open(os.path.join(tmp, f"main-{side}.log"), "ab") as out:
        r = subprocess.run([emberctl, "run", "--standalone", "--work-root", root, "--worker",
                            worker, spec], stdout=out, stderr=subprocess.STDOUT, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"main job ({side}) exited {r.returncode}; see {tmp}/main-{side}.log")
    metrics = glob.glob(os.path.join(root, "*", "metrics", "rank-0.jsonl"))
    logs = glob.glob(os.path.join(root, "*", "logs", "rank-0.log"))
    if len(metrics) != 1 or len(logs) != 1:
        raise RuntimeError(f"main job ({side}): expected one job under {root}")
    rows = [json.loads(l) for l in open(metrics[0]) if l.strip()]
    # jobs.v1.StepMetrics in protobuf's JSON form prints int64 fields as strings ("step": "12");
    # the line format before it printed numbers. Read both.
    for x in rows:
        for k in ("step", "unix_ms", "attempt"):
            if k in x:
                x[k] = int(x[k])
    rows = [x for x in rows if x.get("attempt", 0) == 0]
    if len(rows) < 3:
        raise RuntimeError(f"main job ({side}): {len(rows)} metrics lines in {metrics[0]}")
    first, last = rows[0], rows[-1]
    steps = last["step"] - first["step"]
    seconds = (last["unix_ms"] - first["unix_ms"]) / 1e3
    per_step = {round(x["tokens_per_s"] * x["step_s"]) for x in rows}
    if len(per_step) != 1 or steps <= 0 or seconds <= 0:
        raise RuntimeError(f"main job ({side}): tokens per step {sorted(per_step)}, {steps} steps "
                           f"in {seconds} s")
    tokens_per_step = per_step.pop()
    m = re.search(r"\| (\d+) threads \|", open(logs[0], errors="replace").read())
    if not m:
        raise RuntimeError(f"main job ({side}): no thread count in {logs[0]}")
    shutil.rmtree(root, ignore_errors=True)
    return tokens_per_step * steps / seconds, tokens_per_step, steps, int(m.group(1))


def pipeline(side, binary, steps, extra, tmp):
    """Runs pipeline_bench once; returns its 1f1b row's tok/s."""
    cmd = [binary, "--json", "--rounds=1", f"--steps={steps}", *extra]
    with open(os.path.join(tmp, f"pipeline-{side}.log"), "ab") as err:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"pipeline_bench ({side}) exited {r.returncode}; see "
                           f"{tmp}/pipeline-{side}.log")
    doc = json.loads(r.stdout)
    t = doc["tables"][0]
    col = t["columns"].index("tok/s")
    for row in t["rows"]:
        if row[0] == "1f1b":
            return float(row[col]), doc.get("meta", {})
    raise RuntimeError(f"pipeline_bench ({side}): no 1f1b row in {t['title']!r}")


def target(name, value, peer, unit, note):
    c = value / peer
    return {"name": name, "value": value, "peer": peer, "goal": GOAL, "goal_applies_to": "value/peer",
            "higher_is_better": True, "unit": unit, "compared": c, "met": c >= GOAL,
            "status": "met" if c >= GOAL else f"missed by {abs(c - GOAL) / GOAL * 100:.1f}%",
            "reason": None, "note": note}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--emberctl", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--pipeline-bench", required=True)
    ap.add_argument("--spec", required=True, help="the main job's spec (examples/tiny-gpt.yaml)")
    ap.add_argument("--before", default=BEFORE_DEFAULT)
    ap.add_argument("--tree", default=None, help="the before worktree (default "
                    "~/.cache/ember-bench/before-<commit>)")
    ap.add_argument("--repo", default=None)
    ap.add_argument("--rounds", type=int, default=4, help="at least 3 (--quick: 1)")
    ap.add_argument("--steps", type=int, default=16, help="pipeline_bench's measured steps")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-build", action="store_true",
                    help="use the before tree's binaries as they are when all exist")
    a = ap.parse_args()
    if not a.quick and a.rounds < 3:
        log(f"--rounds={a.rounds}: at least 3 rounds (--quick runs 1)")
        return 2
    rounds = 1 if a.quick else a.rounds
    after = {k: os.path.abspath(v) for k, v in
             {"emberctl": a.emberctl, "worker": a.worker, "pipeline_bench": a.pipeline_bench}.items()}
    spec = os.path.abspath(a.spec)
    tmp = tempfile.mkdtemp(prefix="regression_bench-", dir=os.environ.get("TEST_TMPDIR"))
    try:
        commit, tree, before = prepare_before(a)
    except (RuntimeError, OSError) as e:
        log(str(e))
        return 1
    repo = find_repo(a.repo)
    after_rev = git(repo, "describe", "--always", "--dirty", "--abbrev=7").stdout.strip() or "?"
    sides = [("before", before, []), ("after", after, ["--pp_fsdp=false"])]
    lb = load()
    main_tps = {"before": [], "after": []}
    pipe_tps = {"before": [], "after": []}
    info = {}
    rows = []
    try:
        for side, b, _ in sides:  # unmeasured warm-up of each side
            main_job(side, b["emberctl"], b["worker"], spec, tmp)
        for side, b, extra in sides:
            pipeline(side, b["pipeline_bench"], a.steps, extra, tmp)
        for r in range(rounds):
            for side, b, _ in sides:
                tps, per_step, steps, threads = main_job(side, b["emberctl"], b["worker"], spec, tmp)
                info.setdefault(side, {}).update(tokens_per_step=per_step, steps=steps,
                                                 threads=threads)
                main_tps[side].append(tps)
                rows.append([r, "main job", side, tps])
                log(f"round {r} main job {side}: {tps:.0f} tok/s")
            for side, b, extra in sides:
                tps, meta = pipeline(side, b["pipeline_bench"], a.steps, extra, tmp)
                info.setdefault(side, {})["pipeline_meta"] = meta
                pipe_tps[side].append(tps)
                rows.append([r, "pipeline 1f1b", side, tps])
                log(f"round {r} pipeline 1f1b {side}: {tps:.0f} tok/s")
    except (RuntimeError, OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
        log(f"failed: {e}")
        for f in sorted(glob.glob(os.path.join(tmp, "*.log"))):
            print(f"--- {f} (tail) ---\n{open(f, errors='replace').read()[-1500:]}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
        return 1
    le = load()
    shutil.rmtree(tmp, ignore_errors=True)
    for k in ("tokens_per_step", "steps", "threads"):
        if info["before"][k] != info["after"][k]:
            log(f"main job: {k} differs: before {info['before'][k]}, after {info['after'][k]}")
            return 1
    pm = {s: info[s]["pipeline_meta"] for s in ("before", "after")}
    for k in ("stages", "micro_batches", "micro_batch_size", "steps", "rounds", "model"):
        if pm["before"].get(k) != pm["after"].get(k):
            log(f"pipeline_bench: {k} differs: before {pm['before'].get(k)}, after "
                f"{pm['after'].get(k)}")
            return 1
    med = lambda v: statistics.median(v)
    for name, d in (("main job", main_tps), ("pipeline 1f1b", pipe_tps)):
        for side in ("before", "after"):
            rows.append(["median", name, side, med(d[side])])
    both = (f"before = {commit[:7]} (worktree {tree}, built there by bazel), after = the current "
            f"tree ({after_rev}); {rounds} rounds interleaved in one run (each round: before, "
            "after), each side warmed up once unmeasured; value = after's median, peer = "
            "before's median")
    mi = info["after"]
    targets = [
        target("main_job_tokens_per_s_after_vs_before", med(main_tps["after"]),
               med(main_tps["before"]), "tok/s",
               f"compared: examples/tiny-gpt.yaml via emberctl run --standalone, the same spec "
               f"and data on both sides (FSDP, 4 CPU ranks, {mi['threads']} compute thread(s) "
               f"per rank on both, read from each side's log); tokens/s over steps 10..150 "
               f"({mi['steps']} steps x {mi['tokens_per_step']} tokens, rank 0's metric "
               f"timestamps); {both}"),
        target("pipeline_1f1b_tokens_per_s_after_vs_before", med(pipe_tps["after"]),
               med(pipe_tps["before"]), "tok/s",
               f"compared: pipeline_bench's 1f1b row (the same source on both sides: 2 ranks, 1 "
               f"compute thread per rank, {pm['after'].get('micro_batches')} micro-batches, "
               f"{pm['after'].get('model')}; --rounds=1 --steps={a.steps} after 1 warm-up step "
               f"on both); {both}"),
    ]
    report = {
        "benchmark": "regression_bench",
        "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
        "quick": bool(a.quick), "load_begin": lb, "load_end": le,
        "tables": [{
            "title": f"tokens/s before ({commit[:7]}, main before issue 32) and after "
                     f"({after_rev}), interleaved",
            "columns": ["round", "workload", "side", "tok/s"],
            "rows": rows, "load_begin": lb, "load_end": le,
            "notes": ["main job: emberctl run --standalone examples/tiny-gpt.yaml with that "
                      "side's emberctl and ember-worker; tok/s over the logged steps 10..150 of "
                      "rank 0",
                      "pipeline 1f1b: that side's pipeline_bench --rounds=1 --steps="
                      f"{a.steps}, its 1f1b row (tokens per step / median slowest-rank step "
                      "time); the after side also passes --pp_fsdp=false (untimed memory row)",
                      "a failed round fails the run"],
        }],
        "targets": targets,
        "meta": {"rounds": rounds, "cores": os.cpu_count(), "before": commit, "after": after_rev,
                 "before_tree": tree, "goal": GOAL},
    }
    if a.json:
        print(json.dumps(report))
    else:
        for row in rows:
            print("  ".join(f"{c:.1f}" if isinstance(c, float) else str(c) for c in row))
        for t in targets:
            print(f"{t['name']}: {t['value']:.0f} vs {t['peer']:.0f} -> {t['compared']:.3f} "
                  f"({t['status']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
