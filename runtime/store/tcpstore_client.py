#!/usr/bin/python3
"""A real torch TCPStore client against ember-store's TCPStore port (tcpstore_compat_test).

  /usr/bin/python3 tcpstore_client.py PORT                      # Debian's torch 1.13 (1.x protocol)
  /opt/ember-peers/torch-2.15/bin/python tcpstore_client.py PORT  # torch 2.15 (2.x protocol)
Checks set/get/add/wait/compare_set/delete_key/num_keys (1.13 has no Python check()); on torch 2.x
also check, append, multi_get, multi_set, wait's timeout, several clients on one store, and
timeouts/reconnects of the 2.x client (its validation handshake and ping). Checks that a key the
Ember client set is visible ("from_ember" = "ember"), sets "from_torch", then rendezvouses 4
processes with torch.distributed.init_process_group(backend="gloo", store=...) and all_reduces.
Prints the torch version first. Exit 0 = all held.
"""
import multiprocessing as mp
import os
import sys
import time
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


def v2_ops(port, s):
    """The queries a 1.13 client cannot send: CHECK, APPEND, MULTI_GET, MULTI_SET."""
    check(s.check(["cs", "n"]) and not s.check(["cs", "never"]), "check")
    s.append("ap", "ab")
    s.append("ap", "\0cd")
    check(s.get("ap") == b"ab\0cd", "append creates then appends")
    s.multi_set(["m1", "m2", "m3"], ["one", "", "three"])
    check(s.multi_get(["m3", "m1", "m2"]) == [b"three", b"one", b""], "multi_set then multi_get")
    check(s.multi_get(["ap", "n"]) == [b"ab\0cd", b"3"], "multi_get of set/add/append keys")
    # multi_get waits for every key (the server answers when the last one is set by another client).
    other = store(port)
    other.set("late", "here")
    check(s.multi_get(["m1", "late"]) == [b"one", b"here"], "multi_get sees another client's key")
    # A 2.x client's wait that times out sends CANCEL_WAIT and reads the answers, so the same
    # connection goes on (1.13's is left in an unknown state, see main()).
    s2 = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=1))
    try:
        s2.multi_get(["m1", "never2"])
        check(False, "multi_get of a missing key waits out the store timeout")
    except Exception:
        pass
    check(s2.get("m2") == b"", "the 2.x client is usable after a multi_get timeout")
    t0 = time.monotonic()
    try:
        s2.get("never3")
        check(False, "get of a missing key times out")
    except Exception as e:  # DistStoreError("wait timeout ...")
        check(0.8 < time.monotonic() - t0 < 10, f"get timeout after 1 s, took {time.monotonic() - t0:.1f} s ({e})")
    check(s2.get("m1") == b"one", "the 2.x client is usable after its own timeout")
    check(s2.num_keys() >= 8, "num_keys")


def main():
    port = int(sys.argv[1])
    print(f"torch {torch.__version__}", flush=True)
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
    if int(torch.__version__.split(".")[0]) >= 2:
        v2_ops(port, s)
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
