"""collie against Gloo through torch.distributed on the test bed, in one job
(docs/multihost.md, "against Gloo"); as root:

    python3 docs/perf/multihost/vs_gloo.py --hosts 2 -n 2 --rate 1gbit --ops all_reduce --sizes 1M,4M,16M,64M
    python3 docs/perf/multihost/vs_gloo.py --hosts 3 -n 1 --sizes 64K,1M,4M,16M

makes a bed (collie.testbed.TestBed) and starts torchrun on each host with
this file as the program. Each rank calls dist.init_process_group("collie")
(collie's world on torch's store: the link is measured at setup, so the
tuner picks as any job would) and dist.new_group(backend="gloo") over the
same ranks. Then rank 0 and the first rank of the next host measure the link
as `collie bench` does (collie.bench.link_rate), and each (op, size) runs:
two warm-up calls and a timed one on each backend, then ROUNDS rounds in
which each backend (the order alternating from round to round) runs the
same number of calls back to back after a barrier on its own group, timed
on the slowest rank: as many as fit BUDGET seconds on the slower backend,
at least CALLS, at most 50. Printed: the
median round per call for each backend, Gloo / collie from the medians and
the range of Gloo / collie over the rounds (each round's pair ran side by
side), the bound across hosts (collie.bench.link_bytes at the link
measured), the share of it collie reached (bound / collie's time; above 1
where a small call slips through the shaper's burst) and collie's pick
(collie.collectives.choose).

Sizes count as collie bench counts them: the whole buffer for all_reduce,
broadcast, reduce and all_to_all (all_to_all_single), the output of
all_gather (all_gather_single, or all_gather_into_tensor before torch
2.13) and the input of reduce_scatter (reduce_scatter_single, or
reduce_scatter_tensor), float32, rounded down to a multiple of the ranks.
"""
import argparse
import os
import secrets
import statistics
import sys
import time

OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all")


def _args(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("-n", type=int, default=1, help="ranks per host")
    p.add_argument("--rate", default=None, help="shape the links, e.g. 1gbit")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--sizes", default="64K,1M,4M")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=2, help="calls per round at least")
    p.add_argument("--budget", type=float, default=0.1,
                   help="seconds per round of the slower backend: more calls where they are short (at most 50)")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def drive(opts, argv):
    """Make the bed and run torchrun on each host."""
    from collie import testbed
    with testbed.TestBed(opts.hosts, rate=opts.rate) as bed:
        argvs = [[sys.executable, "-m", "torch.distributed.run", "--nnodes", str(opts.hosts),
                  "--node-rank", str(i), "--master-addr", bed.addresses[0],
                  "--master-port", str(testbed.MASTER_PORT), "--nproc-per-node", str(opts.n),
                  os.path.abspath(__file__), "--worker", *argv] for i in range(opts.hosts)]
        env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="eth0",
                   COLLIE_TOKEN=os.environ.get("COLLIE_TOKEN", secrets.token_hex(16)))
        results = bed.run_each(argvs, timeout=opts.timeout, env=env, capture=False)
    return max(r.returncode for r in results)


def work(opts):
    import numpy as np
    import torch
    import torch.distributed as dist

    import collie
    import collie.torch  # noqa: F401
    from collie import bench, collectives
    torch.set_num_threads(1)
    dist.init_process_group("collie")
    gloo = dist.new_group(backend="gloo")
    world = dist.group.WORLD
    n, rank = dist.get_world_size(), dist.get_rank()
    g = collie.group.world().group
    hosts = list(g.network.hosts)
    topo = collie.get_topology()
    found = bench.link_rate()
    rate = found[0] if found else None
    if rank == 0:
        setup = topo["link"]
        print(f"# {opts.hosts} hosts x {opts.n} ranks, rate {opts.rate or 'unshaped'}; torch {torch.__version__}; "
              f"{opts.rounds} rounds per backend, the median round; collie from {os.path.dirname(collie.__file__)}",
              flush=True)
        print("# link at setup: " + (f"{setup['rate_bytes_per_s'] / 1e6:.1f} MB/s ({topo['link_source']})"
                                      if setup else "none")
              + (f"; measured as collie bench does: {rate / 1e6:.1f} MB/s" if rate else ""), flush=True)
        print(f"{'op':<15}{'size':>9} {'gloo ms':>9} {'collie ms':>10} {'gloo/collie':>12} {'per round':>12}"
              f" {'bound ms':>9} {'bound/collie':>13}  calls  collie's pick", flush=True)

    def buffers(op, size):
        c = size // 4 // n * n
        if op == "all_gather":
            return torch.zeros(c // n), torch.zeros(c)
        if op == "reduce_scatter":
            return torch.zeros(c), torch.zeros(c // n)
        if op == "all_to_all":
            return torch.zeros(c), torch.zeros(c)
        return torch.zeros(c), None

    # torch 2.13's names; older torch has only the *_tensor ones
    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def call(op, a, b, group):
        if op == "all_reduce":
            dist.all_reduce(a, group=group)
        elif op == "broadcast":
            dist.broadcast(a, src=0, group=group)
        elif op == "reduce":
            dist.reduce(a, dst=0, group=group)
        elif op == "all_gather":
            gather_single(b, a, group=group)
        elif op == "reduce_scatter":
            scatter_single(b, a, group=group)
        elif op == "all_to_all":
            dist.all_to_all_single(b, a, group=group)

    for op in opts.ops.split(","):
        for size in (bench.parse_size(s) for s in opts.sizes.split(",")):
            a, b = buffers(op, size)
            nbytes = (b if op == "all_gather" else a).numel() * 4
            pick = collectives.choose(g, op, nbytes, exclude=collectives.excluded(g, op))
            groups = {"gloo": gloo, "collie": world}
            one = []
            for group in groups.values():
                for _ in range(2):
                    call(op, a, b, group)
                dist.barrier(group=group)
                t0 = time.perf_counter()
                call(op, a, b, group)
                one.append(time.perf_counter() - t0)
            one = np.array([max(one)])
            collie.all_reduce(one, op=collie.ReduceOp.MAX)
            # as many calls as fit the budget on the slower backend, the same for both
            calls = max(opts.calls, min(50, int(opts.budget / max(one[0], 1e-5))))
            times = {name: [] for name in groups}
            for rnd in range(opts.rounds):
                for name in (["gloo", "collie"] if rnd % 2 == 0 else ["collie", "gloo"]):
                    dist.barrier(group=groups[name])
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        call(op, a, b, groups[name])
                    times[name].append((time.perf_counter() - t0) / calls)
            both = np.array(times["gloo"] + times["collie"])
            collie.all_reduce(both, op=collie.ReduceOp.MAX)
            gl, co = both[:opts.rounds], both[opts.rounds:]
            if rank == 0:
                mg, mc = statistics.median(gl), statistics.median(co)
                per = sorted(x / y for x, y in zip(gl, co))
                bound = bench.link_bytes(op, hosts, nbytes) / rate if rate else 0.0
                print(f"{op:<15}{size:>9} {mg * 1e3:9.2f} {mc * 1e3:10.2f} {mg / mc:11.2f}x "
                      f"{per[0]:5.2f}-{per[-1]:.2f}x "
                      + (f"{bound * 1e3:9.2f} {bound / mc:13.2f}" if bound else f"{'':9} {'':13}")
                      + f" {calls:6}  {pick.algorithm} (segments={pick.segments})", flush=True)
    dist.destroy_process_group()


def main(argv):
    opts = _args(argv)
    if opts.worker:
        work(opts)
        return 0
    return drive(opts, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
