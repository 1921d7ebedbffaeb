#!/usr/bin/python3
"""Checks a job page's rendered DOM (chromium --dump-dom) or an `emberctl plot` SVG against the
ranks' metrics files (<job_dir>/metrics/rank-<r>.jsonl): an independent reading of both.

  check_page.py dom DOM.html JOB_DIR --straggler R [--min-points N]
  check_page.py svg PLOT.svg JOB_DIR [--min-points N]

Exit 0 when every check passes; otherwise prints FAIL lines and exits 1.
"""
import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

FAILS = []


def check(ok, msg):
    if not ok:
        FAILS.append(msg)
        print("FAIL: " + msg, file=sys.stderr)


def jsonl(job_dir, rank, metric):
    """step -> value of the newest line for that step (what the page's `last` shows)."""
    out = {}
    path = os.path.join(job_dir, "metrics", "rank-%d.jsonl" % rank)
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break  # being written
            o = json.loads(line)
            if o.get(metric) is not None:
                out[int(o["step"])] = float(o[metric])  # int64: a JSON string
    return out


def close(a, b):
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def compare(points, ref, what, min_points):
    """Every drawn (step, value) is the logged value at that step; enough points are drawn."""
    check(len(points) >= min_points, "%s: %d points drawn, want >= %d" % (what, len(points), min_points))
    bad = [(s, v, ref.get(s)) for s, v in points if s not in ref or not close(v, ref[s])]
    check(not bad, "%s: points not in the metrics file (step, drawn, logged): %s" % (what, bad[:5]))
    steps = [s for s, _ in points]
    check(steps == sorted(steps), "%s: steps not increasing" % what)
    if points and len(ref) <= 1000:  # not downsampled: every logged step up to the last drawn
        want = sorted(s for s in ref if s <= steps[-1])
        check(steps == want, "%s: %d steps drawn, %d logged up to step %d" %
              (what, len(steps), len(want), steps[-1]))


class Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.svg = None
        self.svg_attrs = {}  # svg id -> attrs
        self.options = {}  # select id -> [option values]
        self.select = None
        self.curves = {}  # (svg id, rank) -> attrs
        self.bars = {}  # rank -> attrs
        self.tags = []
        self.body = {}
        self.text = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "body":
            self.body = a
        if tag == "svg":
            self.svg = a.get("id")
            self.svg_attrs[self.svg] = a
        if tag == "select":
            self.select = a.get("id")
            self.options[self.select] = []
        if tag == "option" and self.select:
            self.options[self.select].append(a.get("value"))
        if tag == "polyline" and "curve" in a.get("class", "").split():
            self.curves[(self.svg, int(a["data-rank"]))] = a
        if tag == "g" and "rank-bar" in a.get("class", "").split():
            self.bars[int(a["data-rank"])] = a

    def handle_data(self, data):
        self.text.append(data)


def dom_points(a):
    steps = [int(x) for x in a.get("data-steps", "").split(",") if x]
    values = [float(x) for x in a.get("data-values", "").split(",") if x]
    check(len(steps) == len(values), "data-steps and data-values differ in length")
    return list(zip(steps, values))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["dom", "svg"])
    p.add_argument("file")
    p.add_argument("job_dir")
    p.add_argument("--straggler", type=int, default=-1)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--min-points", type=int, default=10)
    p.add_argument("--xss", default="")
    args = p.parse_args()
    if args.kind == "svg":
        root = ET.parse(args.file).getroot()  # raises on invalid XML
        ns = "{http://www.w3.org/2000/svg}"
        check(root.tag == ns + "svg", "root element is %s, not svg" % root.tag)
        texts = [t.text or "" for t in root.iter(ns + "text")]
        check(any(t.startswith("loss: ") for t in texts), "no title: %s" % texts[:3])
        check(len([t for t in root.iter(ns + "text") if t.get("class") == "ytick"]) >= 3, "y ticks")
        check(len([t for t in root.iter(ns + "text") if t.get("class") == "xtick"]) >= 3, "x ticks")
        curves = [c for c in root.iter(ns + "polyline") if c.get("class") == "curve"]
        check(len(curves) == args.ranks, "%d curves, want %d" % (len(curves), args.ranks))
        for c in curves:
            rank = int(c.get("data-label").split()[-1])
            pts = [(int(float(x)), float(y)) for x, y in
                   (q.split(":") for q in c.get("data-points").split())]
            check(len(c.get("points").split()) == len(pts), "pixel and data points differ")
            compare(pts, jsonl(args.job_dir, rank, "loss"), "svg rank %d" % rank, args.min_points)
    else:
        d = Dom()
        with open(args.file, encoding="utf-8") as f:
            d.feed(f.read())
        # The third chart: any StepMetrics field, picked from every one (step_s first).
        picked = d.svg_attrs.get("chart-pick", {}).get("data-metric")
        check(picked == "step_s", "the picked chart shows %r, not step_s" % picked)
        for m in ("loss", "grad_norm", "comm_wait_s", "peak_rss_bytes", "mfu", "unix_ms"):
            check(m in d.options.get("metric-pick", []), "the metric picker lacks %s" % m)
        for r in range(args.ranks):
            for svg, metric in (("chart-loss", "loss"), ("chart-tokens_per_s", "tokens_per_s"),
                                ("chart-pick", "step_s")):
                a = d.curves.get((svg, r))
                check(a is not None, "no %s curve for rank %d" % (svg, r))
                if a:
                    compare(dom_points(a), jsonl(args.job_dir, r, metric), "%s rank %d" % (svg, r),
                            args.min_points)
            check(r in d.bars, "no step-time bar for rank %d" % r)
        if args.straggler >= 0:
            for r, a in d.bars.items():
                marked = "straggler" in a.get("class", "").split()
                check(marked == (r == args.straggler),
                      "rank %d straggler=%s (want %s): %s" % (r, marked, r == args.straggler, a))
        check("data-rendered-ms" in d.body, "body has no data-rendered-ms")
        if args.xss:
            check(not any(t == "img" for t, _ in d.tags), "an <img> element was injected")
            check(not any("data-xss" in a for _, a in d.tags), "injected script ran (data-xss)")
            check(any(args.xss in t for t in d.text), "the hostile log line is not shown as text")
        print("rendered at %s ms; bars %s" % (d.body.get("data-rendered-ms"),
                                               {r: a.get("class") for r, a in d.bars.items()}))
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
