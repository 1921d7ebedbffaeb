#!/usr/bin/python3
"""A plain PyTorch DDP training script (gloo, CPU), as a user would launch it with torchrun.

Used by the script-job tests and //bench:script_bench, under Ember and under
`python3 -m torch.distributed.run`. It knows nothing of Ember: it reads torchrun's environment,
checks it, trains a small MLP with DDP and checkpoints itself every step (resuming from the
checkpoint when one exists). Rank 0 appends "attempt step loss" lines to OUT/losses.txt.

  ddp_train.py --out DIR [--steps N] [--step-sleep S] [--timeout S]
               [--hang-rank R --hang-step K]        # rank R stops at step K (attempt 0): a hang
  ddp_train.py --simulate-world 4 --out DIR         # the same losses in one process, no dist
  ddp_train.py --expect-nodes N ...                 # launched on N nodes (default 1)
"""
import argparse, json, os, sys, time
from datetime import timedelta

T0 = time.time()
import torch
import torch.nn as nn

CONTRACT = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
            "OMP_NUM_THREADS"]


def model_for(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))


def batch(seed, step, world, rank):
    g = torch.Generator().manual_seed(seed * 100003 + step * world + rank)
    x = torch.randn(8, 16, generator=g)
    y = x[:, :1] * 0.5 - x[:, 1:2] + 0.1 * torch.randn(8, 1, generator=g)
    return x, y


def simulate(a):
    """The DDP run's losses without torch.distributed: the mean of the per-rank losses and of
    the per-rank gradients, which is what DDP's averaged all-reduce computes."""
    model = model_for(a.seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    out = []
    for step in range(a.steps):
        opt.zero_grad()
        losses = []
        for r in range(a.simulate_world):
            x, y = batch(a.seed, step, a.simulate_world, r)
            loss = nn.functional.mse_loss(model(x), y) / a.simulate_world
            loss.backward()
            losses.append(loss.item() * a.simulate_world)
        opt.step()
        out.append((step, sum(losses) / len(losses)))
    with open(os.path.join(a.out, "simulated.txt"), "w") as f:
        for step, loss in out:
            f.write(f"{step} {loss!r}\n")


def check_env(env, nodes=1):
    missing = [k for k in CONTRACT if k not in env]
    assert not missing, f"torchrun contract variables missing: {missing}"
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    assert 0 <= rank < world, (rank, world)
    local, local_world = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
    group = int(env["GROUP_RANK"])
    assert local_world * nodes == world, \
        f"{nodes} node(s) x LOCAL_WORLD_SIZE {local_world} != WORLD_SIZE {world}"
    assert 0 <= group < nodes and 0 <= local < local_world, (group, local, local_world)
    assert rank == group * local_world + local, ("RANK", rank, group, local_world, local)
    if nodes > 1:  # the other nodes' ranks reach MASTER_ADDR: not loopback (master_answers)
        assert not env["MASTER_ADDR"].startswith("127.") and env["MASTER_ADDR"] != "localhost", \
            f"MASTER_ADDR {env['MASTER_ADDR']} is loopback on a {nodes}-node job"
    assert int(env["ROLE_RANK"]) == rank and int(env["ROLE_WORLD_SIZE"]) == world
    assert env["ROLE_NAME"] == "default", env["ROLE_NAME"]
    assert int(env["MASTER_PORT"]) > 0
    assert int(env["TORCHELASTIC_RESTART_COUNT"]) <= int(env["TORCHELASTIC_MAX_RESTARTS"])
    assert env["OMP_NUM_THREADS"] == "1", "torchrun sets OMP_NUM_THREADS=1 for several local ranks"


def master_answers(env, nodes):
    """On several nodes, MASTER_ADDR:MASTER_PORT answers a plain TCP connection. Checked once the
    process group is up: Ember's daemon listens there before any rank starts, but torchrun with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (//bench:slurm_bench) leaves it to rank 0's
    init_process_group, so an earlier probe would race rank 0 (and rank 0 would probe itself)."""
    if nodes > 1:
        import socket
        socket.create_connection((env["MASTER_ADDR"], int(env["MASTER_PORT"])), timeout=10).close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-step", type=int, default=-1)
    p.add_argument("--simulate-world", type=int, default=0)
    p.add_argument("--expect-nodes", type=int, default=1)
    # The attempt-isolation probe (isolation() below) costs rank 0 about 3 s of timeouts at the
    # start of every restarted attempt; benchmarks that time restarts turn it off.
    p.add_argument("--no-isolation-check", action="store_true")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.simulate_world:
        return simulate(a)

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    env = {k: os.environ.get(k) for k in CONTRACT if k in os.environ}
    check_env(env, a.expect_nodes)
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    attempt = int(env["TORCHELASTIC_RESTART_COUNT"])
    with open(os.path.join(a.out, f"env-rank-{rank}-attempt-{attempt}.json"), "w") as f:
        json.dump({**env, "import_s": time.time() - T0, "pid": os.getpid(),
                   "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME")}, f)

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=a.timeout))
    assert dist.get_rank() == rank and dist.get_world_size() == world
    master_answers(env, a.expect_nodes)

    if rank == 0 and not a.no_isolation_check:
        isolation(env, attempt, a.out)

    model = model_for(a.seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    ckpt = os.path.join(a.out, "ckpt.pt")
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
        print(f"rank {rank}: resumed from {ckpt} at step {start} (attempt {attempt})", flush=True)
    ddp = DDP(model)
    for step in range(start, a.steps):
        if rank == a.hang_rank and step == a.hang_step and attempt == 0:
            print(f"rank {rank}: hanging at step {step}", flush=True)
            while True:
                time.sleep(60)
        x, y = batch(a.seed, step, world, rank)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean = mean.item() / world
        if rank == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
            with open(os.path.join(a.out, "losses.txt"), "a") as f:
                f.write(f"{attempt} {step} {mean!r} {time.time()!r}\n")
            print(f"step {step} loss {mean:.6f}", flush=True)
        dist.barrier()  # the checkpoint of `step` is complete before any rank moves on
        if a.step_sleep:
            time.sleep(a.step_sleep)
    dist.barrier()
    # Debian's torch 1.13 under Python 3.11 sometimes deadlocks at interpreter exit: the Reducer's
    # ProcessGroupGloo destructor joins a gloo thread that waits for the GIL the destructor holds
    # (seen under Ember and torchrun alike). Everything is written: leave without finalizers.
    sys.stdout.flush()
    os._exit(0)


def isolation(env, attempt, out):
    """Attempt n's store is its own: a raw TCPStore key of attempt 0 is invisible to attempt 1,
    and attempt 0's MASTER_PORT no longer answers (a stale rank cannot join)."""
    import torch.distributed as dist
    addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    raw = dist.TCPStore(addr, port, None, False, timedelta(seconds=10))
    raw.set(f"isolation/attempt{attempt}", str(port))
    with open(os.path.join(out, f"master-attempt-{attempt}.txt"), "w") as f:
        f.write(f"{addr}:{port}\n")
    if attempt == 0:
        return
    prev = open(os.path.join(out, "master-attempt-0.txt")).read().split()[0]
    paddr, pport = prev.rsplit(":", 1)
    try:  # torch 1.13's Python TCPStore has no check(): a short wait tells
        raw.wait(["isolation/attempt0"], timedelta(seconds=1))
        visible = True
    except Exception:
        visible = False
    result = {"port_differs": int(pport) != port, "previous_key_visible": visible}
    import socket
    try:  # the listener of attempt 0 is gone: the kernel refuses the connection
        socket.create_connection((paddr, int(pport)), timeout=2).close()
        result["socket_connect"] = "connected"
    except OSError as e:
        result["socket_connect"] = type(e).__name__
    t = time.time()
    try:
        dist.TCPStore(paddr, int(pport), None, False, timedelta(seconds=2))
        result["stale_connect"] = "connected"
    except Exception as e:  # refused: torch retries until its timeout, then raises
        result["stale_connect"] = f"refused: {type(e).__name__}: {str(e)[:120]}"
    result["stale_connect_s"] = time.time() - t
    with open(os.path.join(out, "isolation.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
