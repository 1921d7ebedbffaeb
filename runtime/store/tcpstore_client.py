#!/usr/bin/python3
"""Debian's torch TCPStore client against ember-store's TCPStore port (tcpstore_compat_test).

  tcpstore_client.py PORT
Checks set/get/add/wait/compare_set/delete_key/num_keys (1.13 has no Python check()), that a key the Ember client set is
visible ("from_ember" = "ember"), sets "from_torch", then rendezvouses 4 processes with
torch.distributed.init_process_group(backend="gloo", store=...) and all_reduces. Exit 0 = all held.
"""
import multiprocessing as mp
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def store(port):
    return dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)


def rank_main(port, rank, world):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    s = dist.PrefixStore("pg", store(port))
    dist.init_process_group(backend="gloo", store=s, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    if t.item() != world * (world + 1) / 2:
        sys.exit(3)
    dist.barrier()
    dist.destroy_process_group()


def main():
    port = int(sys.argv[1])
    s = store(port)
    check(s.get("from_ember") == b"ember", "an Ember client's key is visible to torch")
    s.set("a", "x\0y")
    check(s.get("a") == b"x\0y", "set then get")
    check(s.add("n", 5) == 5 and s.add("n", -2) == 3, "add")
    check(s.get("n") == b"3", "add stores decimal text")
    s.wait(["a", "n"], timedelta(seconds=5))
    try:
        s.wait(["never"], timedelta(milliseconds=300))
        check(False, "wait on a missing key times out")
    except Exception:  # the client raises on its own timeout
        pass
    s = store(port)  # the timed-out connection is in an unknown state for torch's client
    check(s.compare_set("cs", "", "first") == b"first", "compare_set on a missing key creates")
    check(s.compare_set("cs", "wrong", "second") == b"first", "compare_set mismatch keeps")
    check(s.compare_set("cs", "first", "second") == b"second", "compare_set match swaps")
    check(s.compare_set("absent", "x", "y") == b"x", "compare_set missing key answers expected")
    n = s.num_keys()
    check(s.delete_key("a") and not s.delete_key("a"), "delete_key")
    check(s.num_keys() == n - 1, "num_keys after delete")
    s.set("from_torch", "torch")
    world = 4
    procs = [mp.Process(target=rank_main, args=(port, r, world)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
        check(p.exitcode == 0, f"rank process exit code {p.exitcode}")
    print("OK", flush=True)


if __name__ == "__main__":
    main()
