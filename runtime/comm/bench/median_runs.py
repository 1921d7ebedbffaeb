# Median of several comm_bench --json runs, per (impl, op, ranks, bytes) time; recomputes busbw and
# the targets with the same rules as comm_bench. Usage: median_runs.py out.json run1.json run2.json ...
import json, statistics, sys
runs = [json.load(open(p)) for p in sys.argv[2:]]
def bf(op, n): return 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
keys = {}
for r in runs:
    for row in r["rows"]:
        keys.setdefault((row["impl"], row["op"], row["ranks"], row["bytes"]), []).append(row["time_us"])
rows = []
for (impl, op, n, b), ts in keys.items():
    us = statistics.median(ts); alg = b / (us * 1e-6) / 1e9
    rows.append({"impl": impl, "op": op, "ranks": n, "bytes": b, "time_us": us, "algbw_gbps": alg, "busbw_gbps": alg * bf(op, n), "runs": len(ts)})
R = {(r["impl"], r["op"], r["ranks"], r["bytes"]): r for r in rows}
T = []
for n in (2, 4):
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for b in sorted({k[3] for k in R}):
            if b < 256 << 10: continue
            sz = "%dMiB" % (b >> 20) if b >= 1 << 20 else "%dKiB" % (b >> 10)
            g = lambda i: R[(i, op, n, b)]["busbw_gbps"] if (i, op, n, b) in R else -1
            shm, tcp, gl, mpi = g("ember-shm"), g("ember-tcp"), g("gloo"), g("mpi")
            if shm > 0 and gl > 0: T.append({"name": "%s busbw %dr %s shm vs gloo" % (op, n, sz), "value": shm, "peer": gl, "goal": 2.0, "higher_is_better": True, "unit": "GB/s"})
            if shm > 0 and mpi > 0: T.append({"name": "%s busbw %dr %s shm vs mpi" % (op, n, sz), "value": shm, "peer": mpi, "goal": 1.0, "higher_is_better": True, "unit": "GB/s"})
            if tcp > 0 and gl > 0 and b >= 4 << 20: T.append({"name": "%s busbw %dr %s tcp vs gloo" % (op, n, sz), "value": tcp, "peer": gl, "goal": 2.0, "higher_is_better": True, "unit": "GB/s"})
    a, m = R.get(("ember-shm", "all_reduce", n, 4096)), R.get(("mpi", "all_reduce", n, 4096))
    if a and m: T.append({"name": "all_reduce 4KiB latency %dr shm vs mpi" % n, "value": a["time_us"], "peer": m["time_us"], "goal": 3.0, "higher_is_better": False, "unit": "us"})
json.dump({"benchmark": "comm_bench (median of 3 runs)", "wrong_results": sum(r["wrong_results"] for r in runs), "rows": rows, "targets": T}, open(sys.argv[1], "w"), indent=1)
