#!/usr/bin/python3
"""The benchmark run protocol (issue 30): every committed figure is the median of >= 3 runs.

  bench/run.sh NAME [--runs N] [--threshold 1.0] [--max-wait 900] [--no-build] [--out FILE]
      (--runs 1 or 2: a smoke run, written to /tmp/protocol-NAME-smoke.json unless --out; never a
      committed result: check refuses fewer than 3 runs)
  /usr/bin/python3 bench/protocol.py check FILE...      # what committed_json_test runs
  /usr/bin/python3 bench/protocol.py list               # the benchmarks bench/protocol.json knows

`run` builds the benchmark, then runs its command (bench/protocol.json) N >= 3 times. Before each
run it waits until the 1-minute load average is below --threshold (a quiet machine), up to
--max-wait seconds; a run that started above it is recorded as such and makes the file
`quiet: false`, which committed_json_test refuses. Peers stay interleaved inside each run, as the
benchmarks already do. Every run goes into the output (its full --json report, the load before and
after, wall time, exit code); none is dropped. A run that exits non-zero or prints no valid JSON
stays in the file with `report: null`, and its targets count as not met.

Aggregation, per target name: the runs are ordered from worst to best by `compared` (a missing,
unmeasured or failed target is worst) and the median run is the one at index (N - 1) // 2 (for
even N the lower, i.e. worse, of the two middle runs). The aggregated row carries that run's value,
peer, compared and status, `met` is that run's verdict, and `met_runs` says in how many of the N
runs the target was met. Hence `met` is true exactly when met_runs > N / 2.

A target is informational (shown, never counted as met or missed) when its note starts with
"informational:" or bench/protocol.json lists it under the benchmark's "informational" with a
reason (oversubscribed peers, self-set goals, rows that cannot fail by construction).
"""
import argparse
import copy
import datetime
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import validate_bench_json  # noqa: E402  (same folder)

PROTOCOL_VERSION = 1
MIN_RUNS = 3
DEFAULT_THRESHOLD = 1.0


def read_load():
    try:
        with open("/proc/loadavg") as f:
            a = f.read().split()
        return {"1m": float(a[0]), "5m": float(a[1]), "15m": float(a[2])}
    except (OSError, ValueError, IndexError):
        return {"1m": None, "5m": None, "15m": None}


def cpu_name():
    flags, name = "", "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name == "unknown CPU":
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = line
    except OSError:
        pass
    extras = [x for x in ("avx512f", "avx512_bf16", "amx_bf16") if (" %s " % x) in flags + " "]
    return "%s, %d cores%s" % (name, os.cpu_count() or 0, (" (" + ", ".join(extras) + ")") if extras else "")


def load_config(path=None):
    with open(path or os.path.join(HERE, "protocol.json")) as f:
        return json.load(f)


def is_informational(name, note, cfg_entry):
    info = (cfg_entry or {}).get("informational", {})
    if name in info:
        return info[name]
    if note and note.lower().startswith("informational:"):
        return note[len("informational:"):].strip() or "marked informational by the benchmark"
    return None


def goodness(t):
    """Sort key, larger is better; None/unmeasured/failed is worst."""
    if t is None or t.get("compared") is None or t.get("value") is None:
        return float("-inf")
    if str(t.get("status", "")).startswith("not measured"):
        return float("-inf")
    c = t["compared"]
    return c if t["higher_is_better"] else -c


def aggregate(runs, cfg_entry):
    """The protocol's target rows from the runs' reports (see the module doc)."""
    n = len(runs)
    names = []
    for r in runs:
        for t in (r.get("report") or {}).get("targets", []):
            if t["name"] not in names:
                names.append(t["name"])
    out = []
    for name in names:
        per_run = []
        for r in runs:
            hit = [t for t in (r.get("report") or {}).get("targets", []) if t["name"] == name]
            per_run.append(hit[0] if hit else None)
        order = sorted(range(n), key=lambda i: (goodness(per_run[i]), -i))
        mi = order[(n - 1) // 2]
        med = per_run[mi]
        template = next(t for t in per_run if t is not None)
        if med is None:
            row = copy.deepcopy(template)
            row.update(value=None, peer=None, compared=None, met=False,
                       status="not measured: missing from the median run", reason="missing from the median run")
        else:
            row = copy.deepcopy(med)
        row["median_run"] = mi
        row["runs"] = n
        row["met_runs"] = sum(1 for t in per_run if t is not None and t.get("met") is True)
        row["per_run_compared"] = [None if t is None else t.get("compared") for t in per_run]
        row["informational"] = is_informational(name, row.get("note", ""), cfg_entry)
        out.append(row)
    return out


def wait_quiet(threshold, max_wait):
    start = time.time()
    load = read_load()
    while load["1m"] is not None and load["1m"] >= threshold and time.time() - start < max_wait:
        time.sleep(5)
        load = read_load()
    return load, round(time.time() - start, 1)


def run_once(cmd, env, log_path):
    t0 = time.time()
    with open(log_path, "ab") as log:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, env=env)
    wall = round(time.time() - t0, 2)
    report, err = None, None
    try:
        report = json.loads(p.stdout.decode())
        errs = []
        schema = json.load(open(os.path.join(HERE, "bench_schema.json")))
        validate_bench_json.check(report, schema, schema, "$", errs)
        if not errs:
            validate_bench_json.check_targets(report, errs)
        if errs:
            err = "; ".join(errs[:3])
            report = None
    except ValueError as e:
        err = "no JSON object on stdout: %s" % e
    if p.returncode != 0 and err is None:
        err = "exit code %d" % p.returncode
    return report, wall, p.returncode, err


def cmd_run(a):
    cfg = load_config()
    if a.name not in cfg:
        sys.exit("protocol: no benchmark %r in bench/protocol.json (known: %s)" % (a.name, ", ".join(sorted(cfg))))
    entry = cfg[a.name]
    if a.runs < 1:
        sys.exit("protocol: --runs %d: need at least 1 run (the protocol needs %d)" % (a.runs, MIN_RUNS))
    smoke = a.runs < MIN_RUNS
    if smoke:
        # A smoke run (does the benchmark build, run and print valid JSON?): never a protocol result,
        # so it is not written over bench/results (check refuses a file with < MIN_RUNS runs anyway).
        print("protocol: --runs %d is below the protocol's minimum of %d: a smoke run, not a result "
              "to commit" % (a.runs, MIN_RUNS), file=sys.stderr, flush=True)
    if not a.no_build:
        subprocess.run(["bazel", "build", entry["label"]], check=True)
    cmd = [entry["binary"]] + entry.get("args", []) + ["--json"]
    env = dict(os.environ)
    env.update(entry.get("env", {}))
    log_path = a.log or "/tmp/protocol-%s.log" % a.name
    runs = []
    started = datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
    for i in range(a.runs):
        load_before, waited = wait_quiet(a.threshold, a.max_wait)
        print("protocol: %s run %d/%d, 1-minute load %.2f (waited %.0f s)" %
              (a.name, i + 1, a.runs, load_before["1m"] or -1, waited), file=sys.stderr, flush=True)
        t_start = datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
        report, wall, rc, err = run_once(cmd, env, log_path)
        runs.append({"started": t_start, "wall_s": wall, "exit_code": rc, "error": err,
                     "waited_for_quiet_s": waited, "load_before": load_before, "load_after": read_load(),
                     "report": report})
        print("protocol: %s run %d/%d done in %.1f s%s" % (a.name, i + 1, a.runs, wall,
              "" if err is None else " (FAILED: %s)" % err), file=sys.stderr, flush=True)
    doc = {
        "benchmark": a.name,
        "protocol": {
            "version": PROTOCOL_VERSION, "runs": a.runs, "started": started,
            "command": " ".join(cmd), "env": entry.get("env", {}), "label": entry["label"],
            "cpu": cpu_name(), "quiet_threshold_1m": a.threshold,
            "quiet": all(r["load_before"]["1m"] is not None and r["load_before"]["1m"] < a.threshold for r in runs),
            "like_for_like": entry.get("like_for_like", ""),
        },
        "runs": runs,
        "targets": aggregate(runs, entry),
    }
    out = a.out or (os.path.join("/tmp", "protocol-%s-smoke.json" % a.name) if smoke
                    else os.path.join(HERE, "results", a.name + ".json"))
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    met = sum(1 for t in doc["targets"] if t["met"] and not t["informational"])
    counted = sum(1 for t in doc["targets"] if not t["informational"])
    print("protocol: wrote %s: %d runs, quiet=%s, %d of %d counted targets met by the median" %
          (out, a.runs, doc["protocol"]["quiet"], met, counted), file=sys.stderr)
    return 0


def check_file(path, cfg, errs):
    def bad(msg):
        errs.append("%s: %s" % (path, msg))
    try:
        with open(path) as f:
            doc = json.load(f)
    except ValueError as e:
        return bad("not JSON: %s" % e)
    for k in ("benchmark", "protocol", "runs", "targets"):
        if k not in doc:
            return bad("missing %r: not a protocol file (bench/run.sh NAME writes one)" % k)
    p, runs = doc["protocol"], doc["runs"]
    if p.get("version") != PROTOCOL_VERSION:
        bad("protocol version %r, expected %d" % (p.get("version"), PROTOCOL_VERSION))
    if len(runs) < MIN_RUNS or p.get("runs") != len(runs):
        bad("%d runs recorded (protocol says %r); the protocol needs >= %d" % (len(runs), p.get("runs"), MIN_RUNS))
    thr = p.get("quiet_threshold_1m", DEFAULT_THRESHOLD)
    if thr > DEFAULT_THRESHOLD:
        bad("quiet threshold %r is above %r" % (thr, DEFAULT_THRESHOLD))
    loud = [i for i, r in enumerate(runs) if r["load_before"].get("1m") is None or r["load_before"]["1m"] >= thr]
    if p.get("quiet") is not (not loud):
        bad("quiet=%r but runs %s started at a 1-minute load >= %r" % (p.get("quiet"), loud, thr))
    if loud:
        bad("runs %s started on a loaded machine (1-minute load >= %r): re-run on a quiet machine" % (loud, thr))
    with open(os.path.join(HERE, "bench_schema.json")) as f:
        schema = json.load(f)
    for i, r in enumerate(runs):
        rep = r.get("report")
        if rep is None:
            if not r.get("error"):
                bad("run %d has no report and no error" % i)
            continue
        e = []
        validate_bench_json.check(rep, schema, schema, "$", e)
        if not e:
            validate_bench_json.check_targets(rep, e)
        for x in e:
            bad("run %d: %s" % (i, x))
        if rep.get("benchmark") and not doc["benchmark"].startswith(rep["benchmark"]):
            bad("run %d is a %s report in %s's file" % (i, rep["benchmark"], doc["benchmark"]))
    want = aggregate(runs, cfg.get(doc["benchmark"], {})) if any(r.get("report") for r in runs) else []
    if json.dumps(want, sort_keys=True) != json.dumps(doc["targets"], sort_keys=True):
        got = {t["name"]: t for t in doc["targets"]}
        for w in want:
            g = got.get(w["name"])
            if g is None:
                bad("target %s missing from the aggregate" % w["name"])
                continue
            for k in ("value", "peer", "compared", "met", "met_runs", "status", "informational", "median_run"):
                if g.get(k) != w.get(k):
                    bad("target %s: %s is %r, the median of the runs gives %r" % (w["name"], k, g.get(k), w.get(k)))
        if len(got) != len(want):
            bad("aggregate has %d targets, the runs have %d" % (len(got), len(want)))
    for t in doc["targets"]:
        if t["met"] != (2 * t["met_runs"] > t["runs"]):
            bad("target %s: met=%r but met in %d of %d runs" % (t["name"], t["met"], t["met_runs"], t["runs"]))


def cmd_check(a):
    cfg = load_config()
    errs = []
    for path in a.files:
        check_file(path, cfg, errs)
    for e in errs:
        print(e, file=sys.stderr)
    return 1 if errs else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("name")
    r.add_argument("--runs", type=int, default=MIN_RUNS)
    r.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    r.add_argument("--max-wait", type=float, default=900)
    r.add_argument("--no-build", action="store_true")
    r.add_argument("--out")
    r.add_argument("--log")
    c = sub.add_parser("check")
    c.add_argument("files", nargs="+")
    f = sub.add_parser("refresh", help="recompute the aggregate rows of FILE from its runs "
                       "(after an informational label changed); measures nothing")
    f.add_argument("files", nargs="+")
    sub.add_parser("list")
    a = ap.parse_args()
    if a.cmd == "refresh":
        cfg = load_config()
        for path in a.files:
            doc = json.load(open(path))
            doc["targets"] = aggregate(doc["runs"], cfg.get(doc["benchmark"], {}))
            with open(path, "w") as fh:
                json.dump(doc, fh, indent=1)
                fh.write("\n")
        return 0
    if a.cmd == "run":
        return cmd_run(a)
    if a.cmd == "check":
        return cmd_check(a)
    for k, v in sorted(load_config().items()):
        print("%-22s %s %s" % (k, v["binary"], " ".join(v.get("args", []))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
