#!/usr/bin/python3
"""Writes docs/benchmarks.md and bench/results/RUNS.md from the committed protocol runs.

  /usr/bin/python3 tools/gen_benchmarks.py [--results bench/results] [--notes docs/benchmarks-notes.md]
                                           [--out docs/benchmarks.md] [--runs-out bench/results/RUNS.md]

Inputs: bench/results/NAME.json, one per benchmark, each written by `bench/run.sh NAME` (the run
protocol of bench/protocol.py: >= 3 runs on a quiet machine, every run kept, `met` = the median
run's verdict). Older single-run results live in bench/results/unverified/ and are listed, never
counted. Every figure in the outputs comes from those files, so text and numbers cannot drift
apart; hand-written prose lives in the notes file, appended unchanged.
"""
import argparse
import glob
import json
import os

ORDER = [
    ("store_bench", "Rendezvous store", "//runtime/store:store_bench"),
    ("store_compat_bench", "Store on etcd, TCPStore clients", "//runtime/store:store_compat_bench"),
    ("comm_bench", "Communication", "//runtime/comm:comm_bench"),
    ("comm_veth_bench", "Communication across hosts over veth", "//tests/multihost:veth_bench"),
    ("partition_bench", "Partition of a host: time to running again", "//bench:partition_bench"),
    ("kernel_bench", "Kernels and training step", "//bench:kernel_bench"),
    ("kernel_bench_llama", "Llama kernels and training step", "//bench:kernel_bench"),
    ("fsdp_bench", "FSDP worker", "//runtime/fsdp:fsdp_bench"),
    ("ckpt_bench", "Checkpoints", "//checkpoint:ckpt_bench"),
    ("launch_bench", "Launcher", "//bench:launch_bench"),
    ("recovery_bench", "Recovery", "//bench:recovery_bench"),
    ("recorder_bench", "Flight recorder", "//runtime/flight:recorder_bench"),
    ("pipeline_bench", "Pipeline parallelism", "//bench:pipeline_bench"),
    ("regression_bench", "No speed regression from the composition (issue 32)", "//bench:regression_bench"),
    ("onesided_bench", "One-sided transfers", "//runtime/onesided:onesided_bench"),
    ("onesided_bench_tcp", "One-sided transfers over TCP", "//runtime/onesided:onesided_bench"),
    ("script_bench", "PyTorch scripts under Ember vs torchrun", "//bench:script_bench"),
    ("slurm_bench", "Slurm: sbatch to first step, Ember vs srun torchrun", "//bench:slurm_bench"),
    ("metrics_bench", "Metrics endpoint", "//bench:metrics_bench"),
    ("page_bench", "Job page", "//bench:page_bench"),
    ("publish_bench", "Live weight publishing", "//bench:publish_bench"),
]


def num(v):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        a = abs(v)
        if a >= 1e5:
            return "%.0f" % v
        if a >= 100:
            return "%.1f" % v
        if a >= 1:
            return "%.2f" % v
        if a == 0:
            return "0"
        return "%.3g" % v
    return str(v).replace("|", "\\|").replace("\n", " ")


def load(l):
    return "%s / %s / %s" % (num(l.get("1m")), num(l.get("5m")), num(l.get("15m")))


def goal_text(t):
    op = ">=" if t["higher_is_better"] else "<="
    return "%s %s%s" % (op, num(t["goal"]), " x peer" if t["goal_applies_to"] == "value/peer" else " " + t["unit"])


def verdict(t):
    if t.get("informational"):
        return "informational (%s)" % num(t["informational"])
    s = t["status"]
    if s == "met":
        return "**met**"
    if s.startswith("missed"):
        return "**%s**" % s
    return "not measured: %s" % num(t.get("reason") or s[len("not measured: "):])


def md_table(tab, load_line=True):
    out = ["**%s**" % tab["title"], ""]
    if load_line:
        out += ["Load average (1 / 5 / 15 min): %s at start, %s at end." % (load(tab["load_begin"]), load(tab["load_end"])), ""]
    out.append("| " + " | ".join(c.replace("|", "\\|") for c in tab["columns"]) + " |")
    out.append("|" + "---|" * len(tab["columns"]))
    for r in tab["rows"]:
        out.append("| " + " | ".join(num(c) for c in r) + " |")
    out.append("")
    for n in tab["notes"]:
        out.append("- %s" % n)
    if tab["notes"]:
        out.append("")
    return out


def run_loads(d):
    vals = [r["load_before"].get("1m") for r in d["runs"] if r["load_before"].get("1m") is not None]
    return "%s-%s" % (num(min(vals)), num(max(vals))) if vals else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default="bench/results")
    ap.add_argument("--notes", default="docs/benchmarks-notes.md")
    ap.add_argument("--out", default="docs/benchmarks.md")
    ap.add_argument("--runs-out", default=None, help="default: RESULTS/RUNS.md")
    a = ap.parse_args()
    runs_out = a.runs_out or os.path.join(a.results, "RUNS.md")
    done = {}
    for path in sorted(glob.glob(os.path.join(a.results, "*.json"))):
        with open(path) as f:
            done[os.path.splitext(os.path.basename(path))[0]] = json.load(f)
    old = {}
    for path in sorted(glob.glob(os.path.join(a.results, "unverified", "*.json"))):
        with open(path) as f:
            old[os.path.splitext(os.path.basename(path))[0]] = json.load(f)
    names = [n for n, _, _ in ORDER]
    for n in list(done) + list(old):
        if n not in names:
            names.append(n)
            ORDER.append((n, n, "?"))
    titles = {n: (t, l) for n, t, l in ORDER}

    out = ["# Benchmarks", "",
           "<!-- Generated by tools/gen_benchmarks.py from bench/results/*.json; edit "
           "docs/benchmarks-notes.md for prose, re-run `bench/run.sh NAME` for numbers. -->", "",
           "Every figure below is the median of at least 3 runs made by the run protocol "
           "(`bench/run.sh NAME`, bench/protocol.py): each run waits for a quiet machine (1-minute "
           "load below 1.0), peers run interleaved with ours inside each run, every run is committed "
           "(bench/results/NAME.json; their times and loads in bench/results/RUNS.md), and a target "
           "is met only when the median run meets it. Informational rows (oversubscribed peers, "
           "self-set goals, rows that cannot fail) are shown and never counted.", ""]
    out += ["## Summary", "",
            "| benchmark | target | ours | peer | ratio (or value) | goal | met in k of N runs | verdict | date | load (1 min, at each run's start) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    counts = {"met": 0, "missed": 0, "not measured": 0, "informational": 0}
    for name in names:
        if name not in done:
            continue
        d = done[name]
        date = d["protocol"]["started"][:16].replace("T", " ")
        for t in d["targets"]:
            out.append("| %s | `%s` | %s %s | %s | %s | %s | %d of %d | %s | %s | %s |" % (
                name, t["name"], num(t["value"]), t["unit"], num(t["peer"]), num(t["compared"]),
                goal_text(t), t["met_runs"], t["runs"], verdict(t), date, run_loads(d)))
            if t.get("informational"):
                counts["informational"] += 1
            elif t["status"] == "met":
                counts["met"] += 1
            elif t["status"].startswith("missed"):
                counts["missed"] += 1
            else:
                counts["not measured"] += 1
    missing = [n for n in names if n not in done]
    # A benchmark whose every protocol run failed has no targets: say so, never leave it silent.
    failed = [n for n in names if n in done and not done[n]["targets"]]
    out += ["", "**%d met, %d missed, %d not measured** (counted targets of the benchmarks run under the "
            "protocol); %d informational rows not counted.%s%s" % (
                counts["met"], counts["missed"], counts["not measured"], counts["informational"],
                (" Every protocol run failed (no figure; the errors are in its section): " + ", ".join(failed) + ".") if failed else "",
                (" Not yet run under the protocol (no figure claimed): " + ", ".join(missing) + ".") if missing else ""),
            ""]
    out += ["## Commands", "", "```sh",
            "bench/run.sh --list            # the benchmarks and their exact commands (bench/protocol.json)",
            "bench/run.sh NAME              # >= 3 quiet runs -> bench/results/NAME.json",
            "/usr/bin/python3 tools/gen_benchmarks.py   # this file and bench/results/RUNS.md",
            "```", ""]
    for name in names:
        if name not in done:
            continue
        d = done[name]
        p = d["protocol"]
        title, label = titles[name]
        out += ["## %s (`%s`)" % (title, name), "",
                "Command (`%s`, %d runs from %s UTC, %s): `%s`%s" % (
                    label, p["runs"], p["started"].replace("T", " ").rstrip("Z"), p["cpu"], p["command"],
                    (" with " + " ".join("%s=%s" % kv for kv in sorted(p["env"].items()))) if p.get("env") else ""), ""]
        if p.get("like_for_like"):
            out += ["Like-for-like: %s" % p["like_for_like"], ""]
        if not d["targets"]:
            out += ["**Every run failed; no figure.**", ""]
            for i, r in enumerate(d["runs"]):
                out.append("- run %d (%s, %.0f s, exit %s): %s" % (
                    i + 1, r["started"], r["wall_s"], r["exit_code"], r.get("error") or "no targets"))
            out.append("")
            continue
        out += ["| target | ours (median run) | peer | ratio (or value) | goal | per run | met in | verdict |",
                "|---|---|---|---|---|---|---|---|"]
        for t in d["targets"]:
            out.append("| `%s` | %s %s | %s | %s | %s | %s | %d of %d | %s |" % (
                t["name"], num(t["value"]), t["unit"], num(t["peer"]), num(t["compared"]), goal_text(t),
                " / ".join(num(c) for c in t["per_run_compared"]), t["met_runs"], t["runs"], verdict(t)))
        out.append("")
        for t in d["targets"]:
            if t.get("note"):
                out.append("- `%s`: %s" % (t["name"], num(t["note"])))
        out.append("")
        mid = d["runs"][d["targets"][0]["median_run"]] if d["targets"] else d["runs"][0]
        if mid.get("report"):
            out += ["Tables of run %d of %d (every run's tables are in the JSON):" % (
                d["runs"].index(mid) + 1, len(d["runs"])), ""]
            for tab in mid["report"]["tables"]:
                out += md_table(tab)
    if old:
        out += ["## Not re-measured under the protocol", "",
                "Single runs from before the protocol (bench/results/unverified/, most on a loaded, "
                "shared machine; some with peers on unequal terms, listed in issue 30). Their "
                "figures are kept for the record and **claim nothing**: none is counted above.", "",
                "| benchmark | target | ours | peer | ratio (or value) | goal | single-run status (not counted) | load at start |",
                "|---|---|---|---|---|---|---|---|"]
        for name in names:
            if name not in old or name in done:
                continue
            d = old[name]
            for t in d["targets"]:
                out.append("| %s | `%s` | %s %s | %s | %s | %s | %s | %s |" % (
                    name, t["name"], num(t["value"]), t["unit"], num(t["peer"]), num(t["compared"]),
                    goal_text(t), t["status"], num(d["load_begin"].get("1m"))))
        out.append("")
    if os.path.exists(a.notes):
        with open(a.notes) as f:
            out += ["---", "", f.read().rstrip(), ""]
    with open(a.out, "w") as f:
        f.write("\n".join(out))

    runs_md = ["# Benchmark runs", "",
               "<!-- Generated by tools/gen_benchmarks.py from bench/results/*.json. -->", "",
               "Every run of the protocol, none left out. `waited` is how long the run waited for a "
               "1-minute load below the threshold; `met` counts the run's own verdicts.", ""]
    for name in names:
        if name not in done:
            continue
        d = done[name]
        p = d["protocol"]
        runs_md += ["## %s" % name, "", "`%s` on %s; quiet threshold %s; quiet: %s." % (
            p["command"], p["cpu"], num(p["quiet_threshold_1m"]), str(p["quiet"]).lower()), "",
            "| run | started (UTC) | wall s | waited s | load before (1/5/15) | load after | exit | targets met |",
            "|---|---|---|---|---|---|---|---|"]
        for i, r in enumerate(d["runs"]):
            tg = (r.get("report") or {}).get("targets", [])
            runs_md.append("| %d | %s | %s | %s | %s | %s | %s | %s |" % (
                i + 1, r["started"].replace("T", " ").rstrip("Z"), num(r["wall_s"]), num(r["waited_for_quiet_s"]),
                load(r["load_before"]), load(r["load_after"]),
                r["exit_code"] if not r.get("error") else "%s (%s)" % (r["exit_code"], num(r["error"])),
                "%d of %d" % (sum(1 for t in tg if t["met"]), len(tg))))
        runs_md.append("")
    with open(runs_out, "w") as f:
        f.write("\n".join(runs_md))


if __name__ == "__main__":
    main()
