#!/usr/bin/env python3
"""One run's numbers on the four surfaces that show them, checked against the ranks' metrics files.

Usage: check_surfaces.py JOBS_PROTO JOB_DIR RANKS SURFACES_DIR

The reference is independent of the code under test: the field list comes from the text of
proto/jobs.proto (message StepMetrics, parsed here with a regular expression, not through the
generated code), and the values from <JOB_DIR>/metrics/rank-<r>.jsonl read with Python's json.
SURFACES_DIR holds what the shell test fetched while the workers were stopped:
  metrics.txt               emberd's /metrics
  plot-<field>.json         `emberctl plot JOB --metric <field> --json --max-points 2048`
  page-<field>.json         the job page's series API, /api/jobs/<id>/series?metric=<field>
For every numeric field of StepMetrics:
  * by name: /metrics declares ember_rank_<field> (units spelled out, see prom_name) and both
    series surfaces accept the field as a metric (a file per field, metric echoed back);
  * by value: every logged step's value on each rank equals the metrics file's, on the plot and
    the page (bucket last/min/max at one step per bucket; no extra or missing steps; exactly), and
    the newest line's value equals /metrics' sample for that rank (to the 16 significant digits
    its text format prints). A field absent from a line must be
    absent from every surface for that step.
Also: the metrics files' lines are one JSON object each whose keys are StepMetrics fields only.
Exit status 1 with every mismatch listed.
"""
import json
import math
import os
import re
import sys

FAILS = []


def fail(msg):
    FAILS.append(msg)
    print("FAIL: " + msg, file=sys.stderr)


NUMERIC = {"int32", "int64", "uint32", "uint64", "double", "float", "sint32", "sint64",
           "fixed32", "fixed64", "sfixed32", "sfixed64"}


def step_metrics_fields(proto_path):
    """[(name, type)] of StepMetrics' singular numeric fields, and the names of all its fields."""
    text = open(proto_path).read()
    m = re.search(r"^message StepMetrics \{(.*?)^\}", text, re.S | re.M)
    if not m:
        sys.exit("no message StepMetrics in " + proto_path)
    body = re.sub(r"//[^\n]*", "", m.group(1))
    numeric, every = [], []
    for label, typ, name in re.findall(r"(optional\s+|repeated\s+)?([\w.]+)\s+(\w+)\s*=\s*\d+", body):
        every.append(name)
        if typ in NUMERIC and not label.startswith("repeated"):
            numeric.append((name, typ))
    return numeric, set(every)


def prom_name(field):
    """emberd's /metrics name and the factor applied (docs/operations.md, Metrics)."""
    if field.endswith("_per_s"):
        return "ember_rank_" + field[:-1] + "second", 1.0
    if field.endswith("_ms"):
        return "ember_rank_" + field[:-3] + "_seconds", 1e-3
    if field.endswith("_s"):
        return "ember_rank_" + field[:-2] + "_seconds", 1.0
    return "ember_rank_" + field, 1.0


def same_16(a, b):
    """Equal to 16 significant digits: what Prometheus' text format (prometheus-cpp) prints."""
    return a == b or abs(a - b) <= 1e-15 * max(abs(a), abs(b))


def main():
    proto, job_dir, ranks, surf = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    fields, every = step_metrics_fields(proto)
    if len(fields) < 15:
        sys.exit("only %d numeric StepMetrics fields parsed from %s" % (len(fields), proto))
    # Reference: step -> {field: value} per rank, complete lines only.
    ref = {}
    for r in range(ranks):
        ref[r] = {}
        with open(os.path.join(job_dir, "metrics", "rank-%d.jsonl" % r)) as f:
            for line in f:
                if not line.endswith("\n"):
                    break
                o = json.loads(line)
                unknown = set(o) - every
                if unknown:
                    fail("rank %d: metrics line keys %s are not StepMetrics fields" % (r, sorted(unknown)))
                vals = {}
                for name, typ in fields:
                    if name in o:
                        v = o[name]
                        if typ in ("int64", "uint64", "sint64", "fixed64", "sfixed64"):
                            if not isinstance(v, str):
                                fail("rank %d: %s=%r is not protobuf's JSON form of an int64" % (r, name, v))
                        vals[name] = float(v)
                ref[r][int(o["step"])] = vals
        if len(ref[r]) < 3:
            fail("rank %d logged only %d steps" % (r, len(ref[r])))
    present = {name for r in ref for vals in ref[r].values() for name in vals}
    print("%d numeric StepMetrics fields; in this run's lines: %s" % (len(fields), sorted(present)))

    # /metrics: every field declared; each rank's newest line's values are the samples.
    metrics = open(os.path.join(surf, "metrics.txt")).read()
    samples = {}
    for line in metrics.splitlines():
        m = re.match(r'^(ember_rank_\w+)\{job_id="[^"]*",rank="(\d+)"\} (\S+)$', line)
        if m:
            samples[(m.group(1), int(m.group(2)))] = float(m.group(3))
    for name, _ in fields:
        pname, factor = prom_name(name)
        if not re.search(r"^# TYPE %s gauge$" % re.escape(pname), metrics, re.M):
            fail("/metrics does not declare %s (StepMetrics.%s)" % (pname, name))
        for r in range(ranks):
            last = ref[r][max(ref[r])]
            got = samples.get((pname, r))
            if name not in last:
                if got is not None:
                    fail("/metrics has %s for rank %d, which its last line lacks" % (pname, r))
            elif got is None:
                fail("/metrics lacks %s for rank %d (last line: %s=%r)" % (pname, r, name, last[name]))
            elif not same_16(got, last[name] * factor):
                fail("/metrics %s rank %d = %r, the metrics file says %r" % (pname, r, got, last[name] * factor))

    # The plot and the job page: the series of every field.
    for surface in ("plot", "page"):
        for name, _ in fields:
            path = os.path.join(surf, "%s-%s.json" % (surface, name))
            try:
                s = json.load(open(path))
            except (OSError, ValueError) as e:
                fail("%s: no series for %s: %s" % (surface, name, e))
                continue
            if s.get("metric") != name:
                fail("%s: asked for %s, got metric %r" % (surface, name, s.get("metric")))
            by_rank = {int(x.get("rank", 0)): x for x in s.get("ranks", [])}
            for r in range(ranks):
                x = by_rank.get(r, {})
                steps = [int(v) for v in x.get("step", [])]
                first = [int(v) for v in x.get("first_step", [])]
                want = {st: vals[name] for st, vals in ref[r].items() if name in vals}
                if steps != sorted(want):
                    fail("%s %s rank %d: steps %s, the metrics file has %s" % (surface, name, r, steps, sorted(want)))
                    continue
                if first != steps:
                    fail("%s %s rank %d: buckets span several steps" % (surface, name, r))
                for key in ("last", "min", "max"):
                    vals = [float(v) for v in x.get(key, [])]
                    for st, v in zip(steps, vals):
                        if v != want[st]:  # JSON carries doubles exactly (17 digits)
                            fail("%s %s rank %d step %d: %s %r, the metrics file says %r" %
                                 (surface, name, r, st, key, v, want[st]))
                    if len(vals) != len(steps):
                        fail("%s %s rank %d: %d %s values for %d steps" % (surface, name, r, len(vals), key, len(steps)))
    if FAILS:
        print("%d mismatches" % len(FAILS), file=sys.stderr)
        sys.exit(1)
    print("OK: %d fields x %d ranks on the metrics files, /metrics, plot --json and the job page" %
          (len(fields), ranks))


if __name__ == "__main__":
    main()
