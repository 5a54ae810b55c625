"""The tuner with its model of the link against the tuner without it (its
table), call for call, on a job across hosts (docs/multihost.md, "The
tuner across hosts"):

    collie testbed --hosts 2 -n 2 --rate 1gbit docs/perf/multihost/tuner_ab.py \\
        all_reduce,broadcast,reduce,all_gather,reduce_scatter 65536,262144,1048576,4194304,16777216 4 [0.15 [ungated]]

For each op and size where the two pick differently, blocks of calls (as
many as fit in the budget, 0.15 s) alternate between them, ROUNDS times
after one untimed round; each block is timed on the slowest rank, and the
median block is printed with the range of the paired ratios. "ungated"
lets the model decide everywhere, whatever tuner.MODEL_MAX_RATE and
MODEL_FROM say.
"""
import statistics
import sys
import time

import numpy as np

import collie
from collie import collectives, tuner

collie.init_process_group()
ops = sys.argv[1].split(",")
sizes = [int(s) for s in sys.argv[2].split(",")]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
budget = float(sys.argv[4]) if len(sys.argv) > 4 else 0.15
if len(sys.argv) > 5 and sys.argv[5] == "ungated":
    tuner.MODEL_MAX_RATE, tuner.MODEL_FROM = float("inf"), {}
g = collie.group.world().group
net = g.network
topo = net.topology
n, r = collie.get_world_size(), collie.get_rank()
arms = {"model": topo, "table": topo._replace(link=None)}


def call(op, bufs):
    if op == "all_reduce":
        collie.all_reduce(bufs[0])
    elif op == "broadcast":
        collie.broadcast(bufs[0], src=0)
    elif op == "reduce":
        collie.reduce(bufs[0], dst=0)
    elif op == "all_gather":
        collie.all_gather_into_tensor(bufs[1], bufs[0])
    elif op == "reduce_scatter":
        collie.reduce_scatter_tensor(bufs[1], bufs[0])


def buffers(op, size):
    c = size // 4
    if op == "all_gather":
        return [np.zeros(c // n, np.float32), np.zeros(c // n * n, np.float32)]
    if op == "reduce_scatter":
        return [np.zeros(c // n * n, np.float32), np.zeros(c // n, np.float32)]
    return [np.zeros(c, np.float32)]


if r == 0:
    print(f"# {' '.join(sys.argv[1:])}")
    print(f"# link {topo.link_source}: {1 / topo.link.beta / 1e6:.1f} MB/s, {topo.link.alpha * 1e6:.0f} us",
          flush=True)
for op in ops:
    for size in sizes:
        bufs = buffers(op, size)
        nbytes = bufs[1].nbytes if op == "all_gather" else bufs[0].nbytes
        picks = {}
        for name, t in arms.items():
            net.topology = t
            picks[name] = collectives.choose(g, op, nbytes, exclude=collectives.excluded(g, op))
        net.topology = topo
        if picks["model"].algorithm == picks["table"].algorithm:
            if r == 0:
                print(f"{op:<15}{size:>9}  same: {picks['model'].algorithm}", flush=True)
            continue
        times = {name: [] for name in arms}
        calls = None
        for rnd in range(rounds + 1):
            for name, t in (list(arms.items()) if rnd % 2 == 0 else list(arms.items())[::-1]):
                net.topology = t
                g.prepared.clear()
                g.lanes.clear()
                call(op, bufs)  # prepares: this arm's pick
                if calls is None:  # as many calls as fit the budget, the same for both arms
                    collie.barrier()
                    t0 = time.perf_counter()
                    call(op, bufs)
                    one = np.array([time.perf_counter() - t0])
                    collie.all_reduce(one, op=collie.ReduceOp.MAX)
                    calls = max(2, min(50, int(budget / max(one[0], 1e-5))))
                collie.barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    call(op, bufs)
                dt = np.array([(time.perf_counter() - t0) / calls])
                collie.all_reduce(dt, op=collie.ReduceOp.MAX)
                if rnd:
                    times[name].append(dt[0])
        net.topology = topo
        if r == 0:
            m, tb = statistics.median(times["model"]), statistics.median(times["table"])
            ratios = sorted(b / a for a, b in zip(times["model"], times["table"]))
            print(f"{op:<15}{size:>9}  model {picks['model'].algorithm:<18}{m * 1e3:8.2f} ms   "
                  f"table {picks['table'].algorithm:<18}{tb * 1e3:8.2f} ms   table/model {tb / m:.2f} "
                  f"(paired {ratios[0]:.2f}-{ratios[-1]:.2f}, {calls} calls x {rounds})", flush=True)
g.prepared.clear()
g.lanes.clear()
collie.destroy_process_group()
