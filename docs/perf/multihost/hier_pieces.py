"""all_reduce configurations side by side on a job across hosts
(docs/multihost.md, "Where hier lost at 4 MiB"):

    collie testbed --hosts 2 -n 2 --rate 1gbit docs/perf/multihost/hier_pieces.py 4194304 ring,hier:1,hier 8 8

Each configuration is an algorithm, forced, optionally with ":pieces"
(segments; "hier" alone takes the tuner's pieces across a slow link). In
each of ROUNDS rounds (after an untimed one) every configuration runs
CALLS calls back to back after a barrier, timed on the slowest rank; the
median round is printed with every round's time.
"""
import statistics
import sys
import time

import numpy as np

import collie
from collie import tuner

collie.init_process_group()
size = int(sys.argv[1])
configs = sys.argv[2].split(",")
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
calls = int(sys.argv[4]) if len(sys.argv) > 4 else 5
x = np.zeros(size // 4, np.float32)
g = collie.group.world().group
general, pieces = tuner._segments, tuner._hier_segments
res = {c: [] for c in configs}
for rnd in range(rounds + 1):
    for c in configs:
        algo, _, seg = c.partition(":")
        tuner._segments = (lambda *a, s=int(seg): s) if seg else general
        tuner._hier_segments = (lambda *a, s=int(seg): s) if seg else pieces
        if not seg and algo == "hier":  # the tuner's pieces across a slow link
            tuner._segments = lambda nbytes, *a: pieces(nbytes)
        g.prepared.clear()
        g.lanes.clear()
        collie.all_reduce(x, algorithm=algo)
        collie.barrier()
        t = time.perf_counter()
        for _ in range(calls):
            collie.all_reduce(x, algorithm=algo)
        t = np.array([(time.perf_counter() - t) / calls])
        collie.all_reduce(t, op=collie.ReduceOp.MAX)
        if rnd:
            res[c].append(t[0])
if collie.get_rank() == 0:
    for c in configs:
        print(f"{size:>10} {c:<12} median {statistics.median(res[c]) * 1e3:7.1f} ms   rounds "
              + " ".join(f"{v * 1e3:.1f}" for v in res[c]))
collie.destroy_process_group()
