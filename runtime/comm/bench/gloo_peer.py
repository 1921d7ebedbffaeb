# Gloo peer for comm_bench: torch.distributed's gloo backend of PyTorch 2.15 (the peers venv of
# deploy/peers-venv.sh; comm_bench picks the interpreter, deploy/peers_venv.h), same sizes and
# busbw factors. Prints lines "gloo <op> <nranks> <bytes> <time_us> <cpu_us>" (CPU time per op of
# every rank process, summed). Every rank checks that torch runs one thread
# (torch.get_num_threads() == 1), as comm_bench's ranks reduce on one executor thread.
#   gloo_peer.py N SIZES OPS                 N ranks on this host (loopback), spawned here
#   gloo_peer.py N SIZES OPS RANK INIT       one rank (comm_bench --netns: a rank per namespace,
#                                            INIT tcp://host0:port, GLOO_SOCKET_IFNAME set); rank
#                                            0 prints the lines
#
# "reduce_scatter" is dist.reduce_scatter_tensor (ProcessGroupGloo has it in torch 2.x; size = the
# full input, as comm_bench's). Under a torch without it (Debian's 1.13, chosen explicitly with
# EMBER_PEER_PYTHON) it prints no reduce_scatter lines, and comm_bench reports those targets not
# measured.
#
# Why this used to "hang at startup": every rank picked its own iteration count from its own
# timing of one call, so ranks ran different numbers of collectives and deadlocked (one rank in
# all_reduce, the other in barrier) from the first size where their timings differed. The
# iteration count is now agreed on (MAX over ranks) before each timed loop.
#
# Loop lengths, the same rule as comm_bench's own ranks and mpi_peer.c: 2 warm-up calls, one probe
# call after a barrier, iterations = clamp(COMM_BENCH_LOOP_SECONDS (comm_bench's --loop_seconds,
# default 0.15) / probe, 3, 5000), the MAX over ranks, then 3 timed loops.
import os, sys, time, tempfile, datetime
# Before importing torch: one OpenMP thread per rank (2 shared cores), loopback only.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LOOP_SECONDS = float(os.environ.get("COMM_BENCH_LOOP_SECONDS", "0.15"))


def worker(rank, n, init, sizes, ops, out):
    torch.set_num_threads(1)
    if torch.get_num_threads() != 1:
        sys.exit("gloo_peer.py: torch.get_num_threads() = %d, not 1" % torch.get_num_threads())
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=60))
    lines = []
    for op in ops:
        for size in sizes:
            count = size // 4
            if op == "all_reduce":
                x = torch.ones(count)
                fn = lambda: dist.all_reduce(x)
            elif op == "all_gather":
                x = torch.ones(count // n)
                outs = [torch.empty(count // n) for _ in range(n)]
                fn = lambda: dist.all_gather(outs, x)
            elif op == "reduce_scatter":
                if not hasattr(dist, "reduce_scatter_tensor"):
                    if rank == 0 and size == sizes[0]:
                        sys.stderr.write("gloo_peer.py: torch %s has no reduce_scatter_tensor: "
                                         "reduce_scatter not measured\n" % torch.__version__)
                    continue
                x = torch.ones(count)
                o = torch.empty(count // n)
                fn = lambda: dist.reduce_scatter_tensor(o, x)
            else:
                continue
            for _ in range(2):
                fn()
            dist.barrier()
            t = time.perf_counter(); fn(); one = time.perf_counter() - t
            it = torch.tensor([max(3, min(5000, int(LOOP_SECONDS / max(one, 1e-7))))],
                              dtype=torch.int64)
            dist.all_reduce(it, op=dist.ReduceOp.MAX)  # every rank must run the same count
            iters = int(it.item())
            reps = []
            cpu = -time.process_time()  # this process, every thread (Gloo's own included)
            for _ in range(3):
                dist.barrier()
                t = time.perf_counter()
                for _ in range(iters):
                    fn()
                reps.append((time.perf_counter() - t) / iters)
            cpu = (cpu + time.process_time()) / (3 * iters)
            v = torch.tensor([sorted(reps)[1]], dtype=torch.float64)
            dist.all_reduce(v, op=dist.ReduceOp.MAX)
            c = torch.tensor([cpu], dtype=torch.float64)
            dist.all_reduce(c)  # summed over ranks, like comm_bench's
            if rank == 0:
                lines.append("gloo %s %d %d %.3f %.1f" % (op, n, size, v.item() * 1e6, c.item() * 1e6))
                sys.stderr.write(lines[-1] + "\n")
    if rank == 0 and out:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")
    elif rank == 0:
        sys.stdout.write("\n".join(lines) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1]); sizes = [int(s) for s in sys.argv[2].split(",")]; ops = sys.argv[3].split(",")
    if len(sys.argv) > 5:
        worker(int(sys.argv[4]), n, sys.argv[5], sizes, ops, None)
        sys.exit(0)
    d = tempfile.mkdtemp()
    out = os.path.join(d, "out.txt")
    import socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(worker, args=(n, "tcp://127.0.0.1:%d" % port, sizes, ops, out), nprocs=n)
    sys.stdout.write(open(out).read())
    os.remove(out); os.rmdir(d)
