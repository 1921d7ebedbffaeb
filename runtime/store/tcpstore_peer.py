#!/usr/bin/python3
"""PyTorch TCPStore peer for //runtime/store:store_bench (run with PeerPython(): the torch 2.15
venv of deploy/peers-venv.sh when present, else Debian's /usr/bin/python3 with torch 1.13).

  tcpstore_peer.py ops --op get --clients 4 --seconds 1.5
  tcpstore_peer.py barrier --clients 256
  tcpstore_peer.py ops --op wait --clients 16 --port 29600   # clients only, against that server
Without --port the script starts torch's own TCPStore server (is_master=True) in this process;
with it, the clients talk to whatever serves TCPStore's protocol there (ember-store --tcpstore-port).
Ops: set, get, add, wait (wait on a key that exists), check.
Prints one JSON object on stdout; besides the figures, "torch" (torch.__version__) and "server"
(the TCPStore server measured: "libuv" or "classic" for torch's own, "external" with --port). Mirrors store_bench's own client loop: each client process
connects, reports ready, blocks on a shared pipe until the parent closes it, then runs.
"""
import argparse, json, os, sys, time
from datetime import timedelta

import torch
import torch.distributed as dist


def ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def child_ops(port, rank, op, seconds, ready_w, go_r, out_path):
    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60))
    for i in range(100):
        store.set(f"bench/get/{rank}/{i}", "x" * 16)
    os.write(ready_w, b"r")
    os.read(go_r, 1)
    lats = []
    n = 0
    t_end = ns() + int(seconds * 1e9)
    start = ns()
    while True:
        t0 = ns()
        if t0 >= t_end:
            break
        if op == "set":
            store.set(f"bench/set/{rank}/{n % 100}", "x" * 16)
        elif op == "get":
            store.get(f"bench/get/{rank}/{n % 100}")
        elif op == "wait":
            store.wait([f"bench/get/{rank}/{n % 100}"])
        elif op == "check":
            store.check([f"bench/get/{rank}/{n % 100}"])
        else:
            store.add(f"bench/add/{rank}", 1)
        t1 = ns()
        if len(lats) < 200000:
            lats.append(t1 - t0)
        n += 1
    # Unacknowledged sets: a final get makes sure the server processed them before we stop timing.
    if op == "set":
        store.get(f"bench/set/{rank}/{(n - 1) % 100}")
    end = ns()
    with open(out_path, "w") as f:
        json.dump({"ops": n, "start": start, "end": end, "lats": lats}, f)
    os._exit(0)


def child_barrier(port, world, ready_w, go_r, out_path, key):
    os.write(ready_w, b"r")
    os.read(go_r, 1)
    t0 = ns()
    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=120))
    t1 = ns()
    # The same barrier as Ember's Client::Barrier, in 2 round trips: add (its answer is the
    # arrival count), then wait on the done key, which the last arrival sets first (TCPStore's set
    # awaits no reply).
    if int(store.add(f"{key}/arrived", 1)) == world:
        store.set(f"{key}/done", "1")
    store.wait([f"{key}/done"])
    t2 = ns()
    with open(out_path, "w") as f:
        json.dump({"connect_end": t1, "barrier_end": t2, "start": t0}, f)
    os._exit(0)


def run(kind, args):
    meta = {"torch": torch.__version__, "server": "external"}
    # Clients are forked before torch's server starts: forking a process whose server threads
    # (libuv, torch 2.x) hold locks left 16-client runs hung in the children's connects.
    key = f"barrier/{os.getpid()}"
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    port_r, port_w = os.pipe()
    tmp = f"/tmp/tcpstore-peer-{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    pids = []
    for rank in range(args.clients):
        pid = os.fork()
        if pid == 0:
            os.close(go_w)
            os.close(port_w)
            try:
                port = int.from_bytes(os.read(port_r, 8), "little")  # 8-byte reads are atomic
                out = f"{tmp}/{rank}.json"
                if kind == "ops":
                    child_ops(port, rank, args.op, args.seconds, ready_w, go_r, out)
                else:
                    child_barrier(port, args.clients, ready_w, go_r, out, key)
            except Exception as e:  # noqa
                sys.stderr.write(f"peer child {rank}: {e}\n")
                os._exit(1)
        pids.append(pid)
    if args.port:
        port = args.port  # someone else's server (ember-store --tcpstore-port)
    else:
        server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=120))
        port = server.port
        meta["server"] = "libuv" if getattr(server, "libuvBackend", False) else "classic"
    msg = port.to_bytes(8, "little") * args.clients
    for off in range(0, len(msg), 4096):  # whole 8-byte records per write (4096 % 8 == 0)
        os.write(port_w, msg[off:off + 4096])
    got = 0
    while got < args.clients:
        got += len(os.read(ready_r, args.clients - got))
    go = ns()
    os.close(go_w)
    for pid in pids:
        os.waitpid(pid, 0)
    results = []
    for rank in range(args.clients):
        with open(f"{tmp}/{rank}.json") as f:
            results.append(json.load(f))
        os.unlink(f"{tmp}/{rank}.json")
    os.rmdir(tmp)
    if kind == "ops":
        ops = sum(r["ops"] for r in results)
        span = max(r["end"] for r in results) - min(r["start"] for r in results)
        lats = sorted(l for r in results for l in r["lats"])
        p = lambda q: lats[min(len(lats) - 1, int(q * len(lats)))] / 1e3
        print(json.dumps({"ops_per_s": ops / (span / 1e9), "p50_us": p(0.5), "p99_us": p(0.99), **meta}))
    else:
        connect = (max(r["connect_end"] for r in results) - go) / 1e9
        barrier = (max(r["barrier_end"] for r in results) - max(r["connect_end"] for r in results)) / 1e9
        print(json.dumps({"connect_s": connect, "barrier_s": barrier, **meta}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["ops", "barrier"])
    ap.add_argument("--op", default="get")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--port", type=int, default=0, help="use this TCPStore server (no own server)")
    run(ap.parse_args().kind, ap.parse_args())
