"""`python3 -m ember`: emberctl's job commands from Python, with emberctl's exit codes
(0 ok/SUCCEEDED, 1 FAILED, 2 usage or rejected request, 3 daemon unreachable, 4 bad or missing
token, 5 no such job, 6 CANCELLED, 7 other error)."""
import argparse
import json
import os
import sys

from google.protobuf import json_format

from ember.client import Client, EmberError, Job, default_token_file

EXIT_FOR_STATE = {"SUCCEEDED": 0, "FAILED": 1, "CANCELLED": 6}


def _parser():
    p = argparse.ArgumentParser(prog="python3 -m ember", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", default=os.environ.get("EMBER_ADDRESS", "127.0.0.1:29400"),
                   help="emberd to talk to ($EMBER_ADDRESS, default 127.0.0.1:29400)")
    p.add_argument("--token-file", default=None,
                   help="cluster token ($EMBER_TOKEN_FILE, default /etc/ember/token if readable)")
    p.add_argument("--tls-ca", default=os.environ.get("EMBER_TLS_CA"), help="talk TLS with this CA")
    p.add_argument("--tls-cert", default=os.environ.get("EMBER_TLS_CERT"), help="mTLS certificate")
    p.add_argument("--tls-key", default=os.environ.get("EMBER_TLS_KEY"), help="its key")
    p.add_argument("--output", choices=("text", "json"), default="text")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    s = sub.add_parser("submit", help="submit a job spec (YAML/JSON file)")
    s.add_argument("spec")
    s.add_argument("--id", default="", help="submission id (idempotent resubmission)")
    s.add_argument("--nproc", type=int, default=0, help="override parallelism.world_size")
    s.add_argument("--follow", action="store_true", help="stream logs until the job ends")
    for name, h in (("status", "one job"), ("cancel", "cancel a job"),
                    ("dump", "ask a running job's ranks for flight-recorder dumps")):
        sub.add_parser(name, help=h).add_argument("job")
    ls = sub.add_parser("list", help="jobs, newest first")
    ls.add_argument("--active", action="store_true")
    ls.add_argument("--limit", type=int, default=0)
    lg = sub.add_parser("logs", help="a job's log lines")
    lg.add_argument("job")
    lg.add_argument("--rank", type=int, default=-1)
    lg.add_argument("--follow", action="store_true")
    lg.add_argument("--tail", type=int, default=0)
    w = sub.add_parser("wait", help="wait for a job to end; exit code from its state")
    w.add_argument("job")
    w.add_argument("--timeout", type=float, default=None, help="seconds")
    sub.add_parser("nodes", help="the cluster's nodes and devices")
    return p


def _print_job(job, as_json):
    if as_json:
        print(json_format.MessageToJson(job.proto, indent=None))
        return
    p = job.proto.progress
    line = "%s  %-10s %-10s ranks=%d" % (job.id, job.name, job.state_name, job.world_size)
    if p.steps:
        line += "  step %d/%d loss %.4f" % (p.metrics.step, p.steps, p.metrics.loss)
    if job.reason:
        line += "  (%s)" % job.reason
    print(line)


def _follow(c, job_id):
    for ln in c.logs(job_id, follow=True):
        print("[rank %d] %s" % (ln.rank, ln.line), flush=True)
    return c.wait(job_id)


def _run(a):
    tf = a.token_file or default_token_file()
    c = Client(a.address, token_file=tf, tls_ca=a.tls_ca, tls_cert=a.tls_cert, tls_key=a.tls_key)
    js = a.output == "json"
    with c:
        if a.command == "submit":
            job = c.submit(a.spec, submission_id=a.id, nproc=a.nproc)
            if not a.follow:
                _print_job(job, js)
                return 0
            job = _follow(c, job.id)
            _print_job(job, js)
            return EXIT_FOR_STATE.get(job.state_name, 7)
        if a.command == "status":
            job = c.status(a.job)
            _print_job(job, js)
            return 0
        if a.command == "cancel":
            _print_job(c.cancel(a.job), js)
            return 0
        if a.command == "dump":
            r = c.dump(a.job)
            print(json_format.MessageToJson(r, indent=None) if js else
                  "dumps requested: %s (attempt %d)" % (r.directory, r.attempt))
            return 0
        if a.command == "list":
            jobs = c.list(active_only=a.active, limit=a.limit)
            if not jobs and not js:
                print("no jobs")
            for j in jobs:
                _print_job(j, js)
            return 0
        if a.command == "logs":
            for ln in c.logs(a.job, rank=a.rank, follow=a.follow, tail=a.tail):
                print("[rank %d] %s" % (ln.rank, ln.line), flush=True)
            return 0
        if a.command == "wait":
            job = c.wait(a.job, timeout=a.timeout)
            _print_job(job, js)
            return EXIT_FOR_STATE.get(job.state_name, 7)
        if a.command == "nodes":
            for n in c.nodes():
                if js:
                    print(json_format.MessageToJson(n, indent=None))
                else:
                    devs = " ".join(d.id + ("(" + d.job_id + ")" if d.job_id else "")
                                    for d in n.devices)
                    print("%s %s %s %s" % (n.name, n.address,
                                           "healthy" if n.healthy else "UNHEALTHY", devs))
            return 0
    return 2


def main(argv):
    a = _parser().parse_args(argv)  # usage errors exit 2, as emberctl's
    try:
        return _run(a)
    except EmberError as e:
        if a.output == "json":
            print(json.dumps({"error": {"code": e.code, "message": e.message}}))
        else:
            print("ember: %s" % e, file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
